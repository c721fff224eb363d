// AccessPredictor: learns cyclic (inference) and forward/backward (training) layer orders from the
// access stream, predicts next accesses and next-use distances, tolerates noise and recovers when
// the order changes.
#include "runtime/policy/access_predictor.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "tests/testutil/skip.h"
#include "tools/bench/synthetic_trace.h"

namespace zrtier::policy {
namespace {

constexpr uint64_t kRegion = 3;
constexpr uint64_t kStream = 11;
constexpr uint32_t kChunksPerLayer = 16;

Access Layer(uint32_t layer, uint32_t count = kChunksPerLayer) {
  return Access{kRegion, uint64_t{layer} * kChunksPerLayer, count, Direction::kH2D, kStream};
}

// Feeds `order` to the predictor and returns the fraction of accesses that the predictor's
// PredictNext named exactly (region, first chunk, direction) just before they happened.
double FeedAndScore(AccessPredictor& p, const std::vector<uint32_t>& order) {
  size_t right = 0;
  for (uint32_t layer : order) {
    const Access a = Layer(layer);
    PlannedAccess next;
    if (p.PredictNext(kStream, &next) && next.access.region == a.region &&
        next.access.first_chunk == a.first_chunk && next.access.dir == a.dir)
      ++right;
    p.Observe(a);
  }
  return order.empty() ? 0 : double(right) / double(order.size());
}

std::vector<uint32_t> Cyclic(uint32_t layers) {
  std::vector<uint32_t> v(layers);
  for (uint32_t i = 0; i < layers; ++i) v[i] = i;
  return v;
}

std::vector<uint32_t> ForwardBackward(uint32_t layers) {
  std::vector<uint32_t> v = Cyclic(layers);
  for (uint32_t i = layers; i-- > 0;) v.push_back(i);
  return v;
}

TEST(AccessPredictorTest, FirstPassIsTheProfileThenCyclicOrderIsPredicted) {
  AccessPredictor p;
  const auto pass = Cyclic(64);
  EXPECT_EQ(FeedAndScore(p, pass), 0.0) << "nothing can be predicted before it was seen";
  double total = 0;
  for (int i = 0; i < 4; ++i) total += FeedAndScore(p, pass);
  // Only the very first access of the second pass (the wrap-around, never seen yet) is missed.
  EXPECT_GE(total / 4, 0.99);
  EXPECT_EQ(FeedAndScore(p, pass), 1.0);
}

TEST(AccessPredictorTest, LearnsUntilTheOrderComesBackOrNeverRepeats) {
  AccessPredictor cyclic;
  EXPECT_TRUE(cyclic.Learning()) << "nothing seen yet";
  FeedAndScore(cyclic, Cyclic(64));
  EXPECT_TRUE(cyclic.Learning()) << "the first scan: no context has come back";
  FeedAndScore(cyclic, {0, 1, 2});
  EXPECT_FALSE(cyclic.Learning()) << "the order came back: the period is known";

  AccessPredictor fwdbwd;
  FeedAndScore(fwdbwd, ForwardBackward(64));
  EXPECT_TRUE(fwdbwd.Learning()) << "the way back reads each chunk again, in new contexts";
  FeedAndScore(fwdbwd, {0, 1, 2});
  EXPECT_FALSE(fwdbwd.Learning());

  // Single chunks in an order that never repeats a context: no period is ever known, so the
  // accesses per distinct chunk end the learning.
  AccessPredictor random;
  const uint64_t chunks = 64;
  uint64_t accesses = 0;
  for (uint64_t round = 0; round < AccessPredictor::kLearningReads + 1; ++round)
    for (uint64_t c = 0; c < chunks; ++c, ++accesses) {
      EXPECT_EQ(random.Learning(), accesses <= AccessPredictor::kLearningReads * chunks);
      // The step between consecutive chunks is 2 * round + 1: odd (each round reads all 64) and
      // different every round, so no pair of consecutive chunks -- no context -- comes back.
      const uint64_t chunk = (c * (2 * round + 1) + 7 * round) % chunks;
      random.Observe(Access{kRegion, chunk, 1, Direction::kH2D, kStream});
    }
  EXPECT_FALSE(random.Learning());
}

TEST(AccessPredictorTest, ForwardBackwardOrderIsPredicted) {
  AccessPredictor p;
  const auto iteration = ForwardBackward(32);
  FeedAndScore(p, iteration);  // profile
  // First-order successors alone would be right only about half of the time here (layer k is
  // followed by k+1 going forward and by k-1 going backward); the second-order context resolves it.
  EXPECT_GE(FeedAndScore(p, iteration), 0.95);
  EXPECT_EQ(FeedAndScore(p, iteration), 1.0);
  EXPECT_EQ(FeedAndScore(p, iteration), 1.0);
}

// Training with a layer read as two accesses (two tensors): "k.a k.b" is followed by k+1.a going
// forward and by k-1.a going backward. Only a context reaching back into the previous layer tells
// the two apart; a second-order one is wrong at every layer boundary.
TEST(AccessPredictorTest, ForwardBackwardWithSplitLayersIsPredicted) {
  auto split_order = [](const std::vector<uint32_t>& layers) {
    std::vector<Access> out;
    for (uint32_t l : layers) {
      out.push_back(Layer(l, kChunksPerLayer / 2));
      out.push_back(Access{kRegion, uint64_t{l} * kChunksPerLayer + kChunksPerLayer / 2,
                           kChunksPerLayer / 2, Direction::kH2D, kStream});
    }
    return out;
  };
  auto score = [](AccessPredictor& p, const std::vector<Access>& order) {
    size_t right = 0;
    for (const Access& a : order) {
      PlannedAccess next;
      right += p.PredictNext(kStream, &next) && next.access.first_chunk == a.first_chunk;
      p.Observe(a);
    }
    return double(right) / double(order.size());
  };
  const auto iteration = split_order(ForwardBackward(24));
  for (uint32_t long_order : {8u, 0u}) {
    PredictorConfig config;
    config.long_order = long_order;
    AccessPredictor p(config);
    score(p, iteration);  // profile
    score(p, iteration);
    const double accuracy = score(p, iteration);
    printf("long_order %u: accuracy %.3f\n", long_order, accuracy);
    if (long_order > 0) {
      EXPECT_GE(accuracy, 0.99);
      EXPECT_GT(p.long_context_count(), 0u);
    } else {
      EXPECT_LT(accuracy, 0.95) << "the second-order model alone cannot tell the directions apart";
    }
  }
}

// A layer read whole in one order and in halves in another: when the whole-layer order comes back,
// the plan walks it with whole layers (the count that followed each context), not with the halves
// seen last, so the second halves are planned too.
TEST(AccessPredictorTest, PlanUsesTheChunkCountOfTheOrderWalked) {
  AccessPredictor p;
  const uint32_t layers = 16, half = kChunksPerLayer / 2;
  auto whole_pass = [&] {
    for (uint32_t l = 0; l < layers; ++l) p.Observe(Layer(l));
  };
  auto split_pass = [&] {
    for (uint32_t l = 0; l < layers; ++l) {
      p.Observe(Layer(l, half));
      p.Observe(
          Access{kRegion, uint64_t{l} * kChunksPerLayer + half, half, Direction::kH2D, kStream});
    }
  };
  for (int i = 0; i < 3; ++i) whole_pass();
  for (int i = 0; i < 3; ++i) split_pass();
  for (uint32_t l = 0; l < 3; ++l) p.Observe(Layer(l));  // the whole-layer order is back
  std::vector<PlannedAccess> plan;
  const uint64_t pos = p.Position(kStream);
  p.Plan(kStream, pos, pos + 4 * kChunksPerLayer, 0.0f, &plan);
  ASSERT_GE(plan.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(plan[i].access.first_chunk, (3 + i) * kChunksPerLayer);
    EXPECT_EQ(plan[i].access.chunk_count, kChunksPerLayer);
    EXPECT_EQ(plan[i].pos, pos + i * kChunksPerLayer);
  }
  // The second half of the next layer is planned, right after its first half.
  EXPECT_EQ(p.NextUseDistance({kRegion, 3 * kChunksPerLayer + half}), uint64_t{half});
}

TEST(AccessPredictorTest, RecoversAfterOrderChange) {
  AccessPredictor p;
  for (int i = 0; i < 4; ++i) FeedAndScore(p, Cyclic(48));
  // New order: layers 10..19 skipped, layers 30..34 read twice, a different number of accesses.
  std::vector<uint32_t> changed;
  for (uint32_t l = 0; l < 48; ++l) {
    if (l >= 10 && l < 20) continue;
    changed.push_back(l);
    if (l >= 30 && l < 35) changed.push_back(l);
  }
  const double first = FeedAndScore(p, changed);
  const double second = FeedAndScore(p, changed);
  const double third = FeedAndScore(p, changed);
  const double fourth = FeedAndScore(p, changed);
  printf("accuracy after the change, passes 1-4: %.3f %.3f %.3f %.3f\n", first, second, third,
         fourth);
  EXPECT_LT(first, 0.95) << "a changed order cannot be fully predicted at once";
  // The new successors take over at their second observation (stale ones decay), and the plan
  // is re-walked from there at once.
  EXPECT_GE(third, 0.97);
  EXPECT_GE(fourth, 0.97);
  // The skipped layers are no longer planned: placement sees them as never used again.
  EXPECT_EQ(p.NextUseDistance({kRegion, 15 * kChunksPerLayer}), kNeverUsed);
  EXPECT_NE(p.NextUseDistance({kRegion, 25 * kChunksPerLayer}), kNeverUsed);
}

// An order comes back after some passes of another: the contexts it left are stale and take the
// new successor at their first observation, not after two.
TEST(AccessPredictorTest, AStaleContextTakesTheNewSuccessorAtOnce) {
  AccessPredictor p;
  for (int i = 0; i < 3; ++i) FeedAndScore(p, Cyclic(8));  // 0 1 2 3 ... 7
  std::vector<uint32_t> other;
  for (uint32_t l = 10; l < 18; ++l) other.push_back(l);
  for (int i = 0; i < 6; ++i) FeedAndScore(p, other);
  const std::vector<uint32_t> back = {0, 1, 2, 4, 5, 6, 7};  // layer 3 is no longer read
  const double first = FeedAndScore(p, back), second = FeedAndScore(p, back);
  // The first pass taught (1, 2) -> 4 at once; the plan walked past 3 in the second (walked from
  // contexts of the order with 3); the skip of it was then known, and the plan walked again.
  const double third = FeedAndScore(p, back);
  printf("accuracy when the old order comes back changed, passes 1-3: %.3f %.3f %.3f\n", first,
         second, third);
  EXPECT_EQ(third, 1.0);
}

// Orders that change every 4 passes (zrtier bench policy's cyclic_changing, without the noise):
// whole layers, then halves with some layers read twice or not at all, then whole layers again
// with other layers doubled and skipped. When whole layers come back, a plan walked from the
// halves matches every other entry (the first half's node is the layer's) and must be replaced,
// as must one that walks through contexts of a layer no longer read.
TEST(AccessPredictorTest, OrdersThatComeBackChangedArePredictedAgain) {
  TraceSpec spec;
  spec.layers = 64;
  spec.chunks_per_layer = kChunksPerLayer;
  spec.skip = 0.02;
  spec.change_every = 4;
  spec.stream = kStream;
  std::vector<size_t> ends;  // accesses before the end of each pass
  for (spec.passes = 1; spec.passes <= 12; ++spec.passes) ends.push_back(MakeTrace(spec).size());
  spec.passes = 12;
  const std::vector<Access> trace = MakeTrace(spec);
  AccessPredictor p;
  std::vector<double> accuracy;
  size_t right = 0, begin = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    PlannedAccess next;
    right += p.PredictNext(kStream, &next) && next.access.first_chunk == trace[i].first_chunk &&
             next.access.chunk_count == trace[i].chunk_count;
    p.Observe(trace[i]);
    if (i + 1 == ends[accuracy.size()]) {
      accuracy.push_back(double(right) / double(i + 1 - begin));
      right = 0;
      begin = i + 1;
    }
  }
  printf("accuracy per pass:");
  for (double a : accuracy) printf(" %.2f", a);
  printf("\n");
  for (size_t pass : {5, 6, 7, 9, 10, 11}) EXPECT_GE(accuracy[pass], 0.85) << "pass " << pass;
}

// Chunks no test order reads.
constexpr uint64_t kElsewhere = 100 * kChunksPerLayer;

// Two unexpected accesses in a row (chunks kElsewhere and kElsewhere + 1) rebuild the plan from a
// context never seen. True when the plan is then empty.
bool ReadElsewhereTwice(AccessPredictor& p) {
  p.Observe(Access{kRegion, kElsewhere, 1, Direction::kH2D, kStream});
  p.Observe(Access{kRegion, kElsewhere + 1, 1, Direction::kH2D, kStream});
  std::vector<PlannedAccess> plan;
  const uint64_t pos = p.Position(kStream);
  p.Plan(kStream, pos, pos + 1000, 0.0f, &plan);
  return plan.empty();
}

// Nothing planned names a chunk (the plan was rebuilt from a context never seen): its distance
// comes from its own history, repeated one period later -- a chunk read early in the last period
// is needed before one read late; a chunk never read stays unpredicted.
TEST(AccessPredictorTest, ChunkHistoryAnswersWhatNoPlanNames) {
  AccessPredictor p;
  const uint32_t layers = 8;
  for (int i = 0; i < 3; ++i) FeedAndScore(p, Cyclic(layers));
  EXPECT_TRUE(ReadElsewhereTwice(p)) << "the plan was rebuilt from a context never seen";
  const uint64_t d1 = p.NextUseDistance({kRegion, 1 * kChunksPerLayer});
  const uint64_t d7 = p.NextUseDistance({kRegion, 7 * kChunksPerLayer});
  EXPECT_LT(d1, d7);
  EXPECT_NE(d7, kNeverUsed);
  // One period (8 layers) after its read began: less itself, the 6 layers and 2 chunks since.
  EXPECT_EQ(d1, uint64_t{layers} * kChunksPerLayer - (layers - 1) * kChunksPerLayer - 2);
  // Layer 0's next read is 2 chunks overdue: the pass may run a little longer than the period,
  // so it is due now. Layer 50 was never read.
  EXPECT_EQ(p.NextUseDistance({kRegion, 0}), 0u);
  EXPECT_EQ(p.NextUseDistance({kRegion, 50 * kChunksPerLayer}), kNeverUsed);
  // Overdue by more than 1/kOverdueShare of the period: left out of the order.
  const uint64_t period = uint64_t{layers} * kChunksPerLayer;
  for (uint64_t c = 2; c < period / AccessPredictor::kOverdueShare + 1; ++c)
    p.Observe(Access{kRegion, kElsewhere + c, 1, Direction::kH2D, kStream});
  EXPECT_EQ(p.NextUseDistance({kRegion, 0}), kNeverUsed);
}

// The period the chunk history is repeated by is the median of the contexts' recurrences: layers
// read twice in a row (their context back after two accesses) do not shrink it, so the history
// still predicts the layers read before them.
TEST(AccessPredictorTest, ALayerReadTwiceDoesNotShrinkThePeriod) {
  AccessPredictor p;
  const uint32_t layers = 8;
  for (int i = 0; i < 3; ++i) FeedAndScore(p, Cyclic(layers));
  FeedAndScore(p, {0, 1, 2, 3, 2, 3});  // the context (2, 3) is back after 2 accesses
  ASSERT_TRUE(ReadElsewhereTwice(p)) << "the plan was rebuilt from a context never seen";
  // Layer 1 is due one period (8 layers) after its read began: less itself, the 4 layer reads and
  // the 2 chunks since. (A period of the short recurrence, 2 layers, would make it long overdue.)
  EXPECT_EQ(p.NextUseDistance({kRegion, 1 * kChunksPerLayer}),
            uint64_t{layers} * kChunksPerLayer - 5 * kChunksPerLayer - 2);
}

// A layer read twice in a row that the plan does not name (an order change) makes the predictor
// hedge for half a period: the chunks of the latest access are predicted back one repeat distance
// after their read, not a period later; before it, and once it has lapsed, the plan's distances
// stand.
TEST(AccessPredictorTest, AnUnplannedReReadHedgesForHalfAPeriod) {
  AccessPredictor p;
  const uint32_t layers = 32;
  const uint64_t period = uint64_t{layers} * kChunksPerLayer;
  for (int i = 0; i < 3; ++i) FeedAndScore(p, Cyclic(layers));
  for (uint32_t l = 0; l <= 10; ++l) p.Observe(Layer(l));
  // Planned order: the latest layer is next read one period after its read began.
  EXPECT_EQ(p.NextUseDistance({kRegion, 10 * kChunksPerLayer}), period - kChunksPerLayer);

  p.Observe(Layer(10));  // read again: not planned
  p.Observe(Layer(11));
  p.Observe(Layer(12));
  // Layer 12's chunks (being served) are predicted back one layer after their read.
  EXPECT_EQ(p.NextUseDistance({kRegion, 12 * kChunksPerLayer}), kChunksPerLayer);
  EXPECT_EQ(p.NextUseDistance({kRegion, 12 * kChunksPerLayer + 5}), kChunksPerLayer + 5);
  // Layer 11, read before the latest access, is not hedged: the plan's period stands.
  EXPECT_EQ(p.NextUseDistance({kRegion, 11 * kChunksPerLayer}), period - 2 * kChunksPerLayer);

  // Half a period later without another unplanned re-read the hedge is over.
  for (uint32_t l = 13; l < 13 + layers / 2; ++l) p.Observe(Layer(l));
  const uint32_t last = 12 + layers / 2;
  EXPECT_EQ(p.NextUseDistance({kRegion, uint64_t{last} * kChunksPerLayer}),
            period - kChunksPerLayer);
}

// A layer the order reads twice in a row in two passes of four (a skip dropped the second read in
// the others) is predicted once by its context; after its read its chunks are kept for the repeat
// the context has seen (distance over the repeat's share), until another layer follows.
TEST(AccessPredictorTest, ARepeatTheContextHasSeenKeepsTheLatestAccess) {
  AccessPredictor p;
  const uint32_t layers = 8;
  const uint64_t period = uint64_t{layers} * kChunksPerLayer;
  for (int pass = 0; pass < 4; ++pass)
    for (uint32_t l = 0; l < layers; ++l) {
      p.Observe(Layer(l));
      if (l == 3 && pass % 2 == 0) p.Observe(Layer(3));
    }
  for (uint32_t l = 0; l <= 3; ++l) p.Observe(Layer(l));
  PlannedAccess next;
  ASSERT_TRUE(p.PredictNext(kStream, &next));
  EXPECT_EQ(next.access.first_chunk, 4 * kChunksPerLayer);  // the plan: layer 4 next
  // Layer 3's chunk 2: its repeat would read it kChunksPerLayer + 2 chunks from the start of the
  // latest access; the long context (seen since pass 1: 4, 3, 4) gives the repeat a share of 1/4
  // (weights 1.5 and 0.5), so it is kept as if needed four times that far -- not a period away.
  EXPECT_EQ(p.NextUseDistance({kRegion, 3 * kChunksPerLayer + 2}), 4 * (kChunksPerLayer + 2));
  // Layer 2, read before, is not: one period after its read.
  EXPECT_EQ(p.NextUseDistance({kRegion, 2 * kChunksPerLayer}), period - 2 * kChunksPerLayer);
  p.Observe(Layer(4));  // no repeat: layer 3 is a period away again
  EXPECT_EQ(p.NextUseDistance({kRegion, 3 * kChunksPerLayer}), period - 2 * kChunksPerLayer);
}

TEST(AccessPredictorTest, ToleratesRandomExtraAccesses) {
  const uint64_t seed = testing::TestSeed();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  AccessPredictor p;
  const uint32_t layers = 64;
  size_t scored = 0, right = 0;
  for (int pass = 0; pass < 10; ++pass) {
    for (uint32_t l = 0; l < layers; ++l) {
      const Access a = Layer(l);
      PlannedAccess next;
      const bool hit = p.PredictNext(kStream, &next) && next.access.first_chunk == a.first_chunk;
      if (pass >= 2) {
        ++scored;
        right += hit;
      }
      p.Observe(a);
      if (rng() % 100 < 5) {  // 5 % noise: one random chunk of the working set
        p.Observe(Access{kRegion, rng() % (layers * kChunksPerLayer), 1, Direction::kH2D, kStream});
      }
    }
  }
  const double accuracy = double(right) / double(scored);
  printf("accuracy on layer accesses with 5%% noise: %.3f\n", accuracy);
  EXPECT_GE(accuracy, 0.9);
}

TEST(AccessPredictorTest, NextUseDistanceAndPlanFollowTheCycle) {
  AccessPredictor p;
  const uint32_t layers = 32;
  for (int i = 0; i < 2; ++i)
    for (uint32_t l = 0; l < layers; ++l) p.Observe(Layer(l));
  for (uint32_t l = 0; l <= 5; ++l) p.Observe(Layer(l));  // now just after layer 5
  EXPECT_EQ(p.NextUseDistance({kRegion, 6 * kChunksPerLayer}), 0u);
  EXPECT_EQ(p.NextUseDistance({kRegion, 6 * kChunksPerLayer + 3}), 3u);
  EXPECT_EQ(p.NextUseDistance({kRegion, 7 * kChunksPerLayer}), kChunksPerLayer);
  // Layer 5 itself comes back after one full period.
  EXPECT_EQ(p.NextUseDistance({kRegion, 5 * kChunksPerLayer}), (layers - 1) * kChunksPerLayer);
  EXPECT_EQ(p.NextUseDistance({kRegion + 1, 0}), kNeverUsed);

  std::vector<PlannedAccess> plan;
  const uint64_t pos = p.Position(kStream);
  p.Plan(kStream, pos, pos + 40, 0.5f, &plan);
  ASSERT_EQ(plan.size(), 3u);  // 16 + 16 + (8 of 16) chunks
  EXPECT_EQ(plan[0].access.first_chunk, 6 * kChunksPerLayer);
  EXPECT_EQ(plan[1].access.first_chunk, 7 * kChunksPerLayer);
  EXPECT_EQ(plan[2].access.first_chunk, 8 * kChunksPerLayer);
  EXPECT_EQ(plan[0].pos, pos);
  EXPECT_EQ(plan[1].pos, pos + kChunksPerLayer);
  EXPECT_GT(plan[2].confidence, 0.9f);
}

// An access costs at most walk_per_access steps of the walk: a plan discarded on every access (a
// noisy order) is not walked a whole period each time. After two accesses that do not belong to a
// learned 1000-access cycle the plan grows by the budget per access until it spans the period
// again.
TEST(AccessPredictorTest, APlanIsWalkedAtMostTheBudgetPerAccess) {
  PredictorConfig config;
  config.walk_per_access = 16;
  AccessPredictor p(config);
  const uint32_t layers = 1000;
  for (int i = 0; i < 3; ++i)
    for (uint32_t l = 0; l < layers; ++l) p.Observe(Layer(l, 1));
  auto planned = [&] {
    std::vector<PlannedAccess> plan;
    const uint64_t pos = p.Position(kStream);
    p.Plan(kStream, pos, pos + 10 * layers, 0.0f, &plan);
    return plan.size();
  };
  EXPECT_GE(planned(), layers - 1);
  // Two unexpected accesses discard the plan; the next one is a known context again.
  p.Observe(Access{kRegion + 1, 0, 1, Direction::kH2D, kStream});
  p.Observe(Access{kRegion + 1, 1, 1, Direction::kH2D, kStream});
  for (uint32_t l = 0; l < 3; ++l) p.Observe(Layer(l, 1));
  EXPECT_LE(planned(), 3u * 16u);
  for (uint32_t l = 3; l < 100; ++l) p.Observe(Layer(l, 1));
  EXPECT_GE(planned(), layers - 1);  // 97 accesses x 16 > a period
}

TEST(AccessPredictorTest, LowConfidenceStopsThePlan) {
  // Layer 0 is followed by 1 and by 2 alternately: after 0 nothing reaches confidence 0.9 -- for
  // contexts of one or two accesses (a long context sees which of the two came last time).
  PredictorConfig config;
  config.long_order = 0;
  AccessPredictor p(config);
  for (int i = 0; i < 8; ++i) {
    p.Observe(Layer(0));
    p.Observe(Layer(1 + i % 2));
    p.Observe(Layer(3));
  }
  p.Observe(Layer(0));
  std::vector<PlannedAccess> plan;
  const uint64_t pos = p.Position(kStream);
  p.Plan(kStream, pos, pos + 1000, 0.9f, &plan);
  EXPECT_TRUE(plan.empty());
  p.Plan(kStream, pos, pos + 1000, 0.2f, &plan);
  EXPECT_FALSE(plan.empty());
}

TEST(AccessPredictorTest, GrowingAccessKeepsItsNode) {
  // A KV cache read grows by one chunk per pass: same node, the plan uses the newest length.
  AccessPredictor p;
  for (uint32_t pass = 0; pass < 6; ++pass) {
    p.Observe(Layer(0));
    p.Observe(Access{kRegion, 1000, 1 + pass, Direction::kH2D, kStream});
    p.Observe(Layer(2));
  }
  EXPECT_EQ(p.node_count(), 3u);
  PlannedAccess next;
  ASSERT_TRUE(p.PredictNext(kStream, &next));
  EXPECT_EQ(next.access.first_chunk, 0u);
  p.Observe(Layer(0));
  ASSERT_TRUE(p.PredictNext(kStream, &next));
  EXPECT_EQ(next.access.first_chunk, 1000u);
  EXPECT_EQ(next.access.chunk_count, 6u);
}

TEST(AccessPredictorTest, MemoryIsBoundedAndLearningResumes) {
  PredictorConfig config;
  config.max_nodes = 40;
  AccessPredictor p(config);
  for (int i = 0; i < 3; ++i) FeedAndScore(p, Cyclic(32));
  EXPECT_EQ(p.resets(), 0u);
  // 16 one-off targets push the node count past 40: everything is forgotten once.
  for (uint32_t i = 0; i < 16; ++i) p.Observe(Access{kRegion + 1, i, 1, Direction::kH2D, kStream});
  EXPECT_EQ(p.resets(), 1u);
  EXPECT_LE(p.node_count(), 40u);
  FeedAndScore(p, Cyclic(32));  // profile again
  EXPECT_GE(FeedAndScore(p, Cyclic(32)), 0.95);
}

TEST(AccessPredictorTest, StreamsAreLearnedSeparately) {
  AccessPredictor p;
  for (int pass = 0; pass < 3; ++pass) {
    for (uint32_t l = 0; l < 8; ++l) {
      p.Observe(Access{1, l, 1, Direction::kH2D, 100});      // stream 100 reads region 1 forward
      p.Observe(Access{2, 7 - l, 1, Direction::kD2H, 200});  // stream 200 writes region 2 backward
    }
  }
  PlannedAccess a, b;
  ASSERT_TRUE(p.PredictNext(100, &a));
  ASSERT_TRUE(p.PredictNext(200, &b));
  EXPECT_EQ(a.access.region, 1u);
  EXPECT_EQ(a.access.first_chunk, 0u);
  EXPECT_EQ(b.access.region, 2u);
  EXPECT_EQ(b.access.first_chunk, 7u);
  EXPECT_EQ(b.access.dir, Direction::kD2H);
}

}  // namespace
}  // namespace zrtier::policy
