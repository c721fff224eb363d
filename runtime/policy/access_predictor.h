// AccessPredictor: learns the order in which chunk ranges are accessed (copy calls, CPU faults) and
// predicts the coming accesses (DESIGN.md section 5).
//
// Model. Every distinct access target -- (region, first chunk, direction) -- is a node; its chunk
// count is the latest one seen (a KV cache that grows keeps its node). Per stream the predictor
// remembers the last `long_order` nodes and learns, for every context, which node came next:
//   - long order: the last `long_order` nodes -> successors; this separates the directions when a
//     layer is read as several accesses in training (forward "k.a k.b" -> k+1.a, backward
//     "k.a k.b" -> k-1.a: only a context reaching into the previous layer tells them apart);
//   - second order: (node before, node) -> successors; this separates "layer k going forward" from
//     "layer k going backward" when a layer is one access (k-1,k -> k+1 and k+1,k -> k-1);
//   - first order: node -> successors.
// A prediction uses the longest context that was seen (PPM-style): after an order change or a
// noisy access the long contexts are new for a while and the shorter ones predict.
// Each context keeps up to kMaxSuccessors successors with weights: the observed one gains 1 (capped
// at kMaxWeight), every other one is halved and forgotten below kForgetWeight. A stable order thus
// has confidence ~1; a single noisy access costs one halving and is forgotten after two passes; a
// changed order takes over after two observations (stale successors decay away). A context that
// comes back after more than kStaleIntervals of its own intervals (an order of before the last
// change: a layer read whole again after some passes in halves) demotes what it had to half an
// observation, so the new successor takes over at once. The first pass is the profile: nothing is
// predicted before a context has been seen once.
//
// Plan. Per stream the predictor keeps the plan: the predicted sequence of next accesses, walked
// from the current context by always taking the top successor, up to one period (as many
// accesses as lay between the last two occurrences of the current context; before that is known,
// as many as contexts are known; capped). Every planned access has the chunk count it had the last
// time it followed its context (a layer read whole in one order and in halves in another), an
// absolute position (the number of chunks the stream will have accessed before it) and a confidence
// (the lowest step confidence from the current position to it). When the demand access is the
// plan's head, the head is consumed and the walk is extended at the tail (O(1) amortized); when it
// is a planned access a few entries further on (skipped layers) the skipped entries are dropped; an
// unexpected access is first taken for an inserted one (noise) and the plan is kept; a second
// unexpected access in a row rebuilds the plan from the new context. After skipped entries the
// rest of the plan, walked from contexts that contain them, is walked again from the demand's own
// context when that was seen before (the skip belongs to an order: a layer no longer read, or
// whole layers back after an order that read them in halves, whose first half's node is the
// layer's, so that every other planned entry matched); a one-off skip keeps the plan. When learning
// changes the predicted successor of a context (an order change has taken over), the plan is cut
// where it was walked from that context and walked again. Orders that repeat a run longer than
// `long_order` accesses cannot be told apart by any context; they are predicted right only in part.
//
// Next use. NextUseDistance answers from the plans; for a chunk no plan names (after an order
// change the plan is rebuilt, or walks nodes that no longer cover every chunk), from the chunk's
// own history: its last kChunkHistory accesses on the predictor's chunk clock, repeated one
// period (in chunks) later. Layers keep their order through most changes (a new prompt length, a
// layer read in halves), so a chunk read early in the last period is needed early in the next.
// The period is the median of the last kPeriodSamples recurrences of contexts (chunks between two
// occurrences): a layer read twice in a row (a recurrence of a few chunks) or a context back after
// several passes does not move it. A chunk up to 1/kOverdueShare of a period overdue is due now
// (the pass runs a little longer than the median); one overdue by more is taken as left out.
//
// Hedge. A layer read twice in a row by an order not learned yet (after an order change) is a
// re-read the plan does not name: the just-read chunks look a period away and leave first. When an
// unplanned access re-reads data read within two accesses' worth of chunks, the predictor hedges
// for half a period: chunks read within that repeat distance are predicted to come back that far
// after their read (the pool keeps them through one access). It costs about one access's chunks
// of the pool while it lasts; once the plan knows the repeats, no new unplanned one renews it.
//
// Repeat. A layer the order reads twice in a row, whose second read a skip dropped once or twice,
// is predicted once: its context's top successor is the next layer, the repeat a lighter one. When
// the repeat has at least kRepeatShare of the context's weight, the chunks of the latest access are
// predicted back right after it, that distance divided by the share (the pool keeps them through
// one more access at the cost of that access's chunks); the next access ends it either way.
//
// Learning. Until some context has come back (no period is known) the predictor is learning: its
// distances mean nothing yet. An order that never repeats (random accesses) ends the learning
// too, once the accesses reach kLearningReads times the distinct chunks read.
//
// Thread safety: none. The owner serializes all calls (Prefetcher holds its mutex around them).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/policy/access.h"

namespace zrtier::policy {

struct PredictorConfig {
  uint32_t long_order = 8;              // nodes in a long context; 2 or less: none (up to 16)
  uint32_t resync_window = 8;           // plan entries searched for a demand that skipped ahead
  uint32_t max_plan_nodes = 1u << 16;   // cap on the plan's length in accesses
  uint64_t max_plan_chunks = 1u << 22;  // cap on the plan's length in chunks
  uint32_t max_streams = 16;            // streams tracked; the least recently used one is forgotten
  uint32_t max_nodes = 1u << 20;        // distinct access targets; past it everything is forgotten
  uint32_t max_long_contexts = 1u << 20;  // long contexts; past it they are forgotten (relearned)
  // Plan entries walked per observed access at most: a plan discarded on every access (a noisy
  // order, such as the CPU faults of a parallel fill) costs this much per access, not a period.
  uint32_t walk_per_access = 128;
};

struct PlannedAccess {
  Access access;         // region, first_chunk, chunk_count (the node's latest), dir, stream
  uint64_t pos = 0;      // chunks the stream will have accessed before this access
  float confidence = 0;  // lowest step confidence on the way to it (0..1)
};

class AccessPredictor : public NextUseOracle {
 public:
  static constexpr int kMaxSuccessors = 4;
  static constexpr float kMaxWeight = 4.0f;
  static constexpr float kForgetWeight = 0.2f;
  // A context back after more than this many of its own intervals: its successors drop to 0.5.
  static constexpr uint64_t kStaleIntervals = 4;
  // A repeat of the latest access with at least this share of its context's successors keeps
  // its chunks through the next access.
  static constexpr float kRepeatShare = 0.2f;
  // Chunk accesses per distinct chunk after which the predictor stops learning even when no
  // context came back (a first scan reads each chunk once, a scan and its way back twice).
  static constexpr uint64_t kLearningReads = 4;
  // Recurrences the period is the median of; a history prediction is due now until it is overdue
  // by more than 1/kOverdueShare of the period.
  static constexpr size_t kPeriodSamples = 63;
  static constexpr uint64_t kOverdueShare = 16;

  explicit AccessPredictor(PredictorConfig config = {});

  // Learns from one demand access and advances `a.stream`'s plan. REQUIRES: a.chunk_count >= 1.
  void Observe(const Access& a);

  // The predicted next access of `stream` (the plan's head). False when nothing is predicted.
  bool PredictNext(uint64_t stream, PlannedAccess* out) const;

  // Appends to `out` the planned accesses of `stream` that overlap positions [from_pos, until_pos),
  // in order, stopping at the first one whose confidence is below `min_confidence`.
  void Plan(uint64_t stream, uint64_t from_pos, uint64_t until_pos, float min_confidence,
            std::vector<PlannedAccess>* out) const;

  // Chunks `stream` has accessed so far (its demand position); 0 for an unknown stream.
  uint64_t Position(uint64_t stream) const;
  // Bumped whenever `stream`'s plan is discarded and rebuilt (positions of earlier plans no longer
  // describe the same accesses).
  uint64_t PlanEpoch(uint64_t stream) const;

  // Chunk accesses from now until `key` is next used according to the plans of all streams (the
  // smallest); when no plan contains it, according to its history repeated one period later;
  // kNeverUsed when neither knows (never accessed, or not within the last period).
  uint64_t NextUseDistance(const ChunkKey& key) const override;
  // No context has come back yet and the accesses are fewer than kLearningReads per distinct
  // chunk (see Learning above).
  bool Learning() const override;

  size_t node_count() const { return nodes_.size(); }
  size_t context_count() const { return order2_.size(); }
  size_t long_context_count() const { return order_long_.size(); }
  // Times everything learned was forgotten because max_nodes was reached.
  uint64_t resets() const { return resets_; }

 private:
  struct Succ {
    uint32_t node;
    uint32_t chunk_count;  // the node's chunk count when it last followed this context
    float weight;
  };
  struct SuccList {
    Succ s[kMaxSuccessors];
    uint8_t n = 0;
    uint64_t last_seen = 0;   // the stream's access count when this context last occurred
    uint64_t interval = 0;    // accesses between its last two occurrences
    uint64_t last_clock = 0;  // clock_ when this context last occurred
    void Observe(uint32_t node, uint32_t chunk_count);
    // The heaviest successor and its share of the total weight. False when empty.
    bool Top(Succ* top, float* confidence) const;
    // `node`'s share of the total weight (0 when it is not a successor).
    float Share(uint32_t node) const;
  };
  struct Node {
    uint64_t region;
    uint64_t first_chunk;
    uint32_t chunk_count;
    Direction dir;
    uint32_t mapped = 0;  // chunks [first_chunk, first_chunk + mapped) are in chunk_nodes_
  };
  struct NodeKey {
    uint64_t region, first_chunk;
    Direction dir;
    bool operator==(const NodeKey&) const = default;
  };
  struct NodeKeyHash {
    size_t operator()(const NodeKey& k) const {
      return ChunkKeyHash()(ChunkKey{k.region ^ (uint64_t(k.dir) << 61), k.first_chunk});
    }
  };
  struct Entry {
    uint32_t node;
    uint32_t chunk_count;  // as planned
    uint64_t raw_pos;      // predicted position = raw_pos + StreamState::shift
    float confidence;
  };
  struct NodeUse {
    uint64_t raw_pos;
    uint32_t chunk_count;  // as planned
  };
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint32_t kMaxLongOrder = 16;
  // The last nodes of an access sequence, most recent last (kNone before there were that many).
  struct Recent {
    std::array<uint32_t, kMaxLongOrder> n;
    Recent() { n.fill(kNone); }
    void Push(uint32_t id);
    uint32_t back(int i = 0) const { return n[kMaxLongOrder - 1 - i]; }  // i = 0: the latest
  };
  struct StreamState {
    uint64_t id = 0;
    uint64_t last_use = 0;  // observe tick, for forgetting the least recently used stream
    Recent recent;          // the last nodes accessed
    Recent tail;            // the last nodes of the walk (plan tail)
    uint64_t pos = 0;       // chunks accessed
    uint64_t accesses = 0;  // accesses observed
    uint64_t period = 0;    // accesses between two occurrences of a context (decaying max)
    int64_t shift = 0;      // correction of raw plan positions after inserted/skipped accesses
    uint64_t epoch = 0;
    uint32_t misses = 0;  // unexpected accesses in a row
    uint64_t plan_chunks = 0;
    bool walk_ended = false;  // the tail reached an unknown context; retried after learning
    std::deque<Entry> plan;
    // The plan entries of each node, by raw position, ascending (the bookkeeping is per access,
    // not per chunk: a 4096-chunk layer costs one update per step of the plan).
    std::unordered_map<uint32_t, std::deque<NodeUse>> uses;
  };

  uint32_t Intern(const Access& a);
  StreamState& StreamFor(uint64_t stream);
  const StreamState* FindStream(uint64_t stream) const;
  // The key of the long context ending at `r`; false while `r` holds fewer than long_order nodes.
  bool LongKey(const Recent& r, uint64_t* key) const;
  // The predicted successor of context `r` by the longest order that knows one; false if none.
  bool Predict(const Recent& r, Succ* next, float* confidence) const;
  // Whether a context of two or more nodes ending at `r` has been seen before.
  bool Known(const Recent& r) const;
  // The successors of the longest context ending at `r` that knows any (what Predict asks); null
  // if none.
  const SuccList* LongestKnown(const Recent& r) const;
  void PopFront(StreamState& s);
  void ClearPlan(StreamState& s);
  // Drops the planned entries walked from a context ending in (a, b) onwards (the prediction for
  // it changed); the next Extend walks them again with the current tables.
  void TruncateAfter(StreamState& s, uint32_t a, uint32_t b);
  // Drops plan entries k.. and sets the walk's tail after the entries kept.
  void TruncateFrom(StreamState& s, size_t k);
  // Walks the plan on by up to config_.walk_per_access entries (to one period, the caps).
  void Extend(StreamState& s);
  PlannedAccess ToPlanned(const StreamState& s, const Entry& e) const;
  // period_chunks_ becomes the median of the latest kPeriodSamples recurrences.
  void UpdatePeriod();

  PredictorConfig config_;
  std::vector<Node> nodes_;
  // Which nodes contain each chunk (for NextUseDistance; filled when a node is interned or grows).
  // Per region, a table indexed by chunk in pages of kChunkPage entries allocated on first use:
  // the pool asks for every chunk of every copy, so a lookup must be an index, not a hash probe
  // (which was a quarter of the pool's time per chunk in `zrtier bench policy --pool`).
  static constexpr int kChunkHistory = 4;
  struct ChunkNodes {
    uint32_t first = kNone;      // usually the only one
    std::vector<uint32_t> more;  // overlapping accesses (split layers, ...)
    // The chunk's latest accesses on the clock (clock_ + 1 at the access; 0 = none), oldest first.
    std::array<uint64_t, kChunkHistory> seen{};
  };
  static constexpr uint64_t kChunkPage = 1024;
  using ChunkPage = std::array<ChunkNodes, kChunkPage>;
  // Null when no node contains the chunk.
  const ChunkNodes* FindChunkNodes(const ChunkKey& key) const;
  ChunkNodes& ChunkNodesFor(const ChunkKey& key);
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<ChunkPage>>> chunk_nodes_;
  std::unordered_map<NodeKey, uint32_t, NodeKeyHash> node_ids_;
  std::vector<SuccList> order1_;                       // indexed by node
  std::unordered_map<uint64_t, SuccList> order2_;      // key: prev2 << 32 | prev1
  std::unordered_map<uint64_t, SuccList> order_long_;  // key: LongKey
  std::vector<StreamState> streams_;
  uint64_t tick_ = 0;
  uint64_t clock_ = 0;            // chunk accesses observed, all streams
  uint64_t period_chunks_ = 0;    // chunks between two occurrences of a context (clock_ units)
  uint64_t distinct_chunks_ = 0;  // chunks read at least once (since the last reset)
  // The latest recurrences of contexts in chunks, a ring (period_chunks_ is their median).
  std::array<uint64_t, kPeriodSamples> recurrences_{};
  uint64_t recurrence_count_ = 0;  // samples taken
  uint64_t resets_ = 0;
  // The hedge for unplanned re-reads: until clock_ reaches hedge_until_, chunks read within the
  // last repeat_chunks_ are predicted to be read again repeat_chunks_ after their read.
  uint64_t repeat_chunks_ = 0;
  uint64_t hedge_until_ = 0;
  uint64_t last_chunks_ = 0;  // chunks of the latest access (served now)
  // The latest access's share among its context's successors when the context predicts another
  // one (0 otherwise): how likely it is read again right away.
  float repeat_share_ = 0;
};

}  // namespace zrtier::policy
