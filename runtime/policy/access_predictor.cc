#include "runtime/policy/access_predictor.h"

#include <algorithm>

namespace zrtier::policy {

void AccessPredictor::SuccList::Observe(uint32_t node, uint32_t chunk_count) {
  bool found = false;
  uint8_t kept = 0;
  for (uint8_t i = 0; i < n; ++i) {
    Succ e = s[i];
    if (e.node == node) {
      e.weight = std::min(e.weight + 1.0f, kMaxWeight);
      e.chunk_count = chunk_count;
      found = true;
    } else {
      e.weight *= 0.5f;
      if (e.weight < kForgetWeight) continue;  // stale successor forgotten
    }
    s[kept++] = e;
  }
  n = kept;
  if (found) return;
  if (n < kMaxSuccessors) {
    s[n++] = Succ{node, chunk_count, 1.0f};
    return;
  }
  uint8_t lightest = 0;
  for (uint8_t i = 1; i < n; ++i)
    if (s[i].weight < s[lightest].weight) lightest = i;
  s[lightest] = Succ{node, chunk_count, 1.0f};
}

bool AccessPredictor::SuccList::Top(Succ* top, float* confidence) const {
  if (n == 0) return false;
  float total = 0;
  uint8_t best = 0;
  for (uint8_t i = 0; i < n; ++i) {
    total += s[i].weight;
    if (s[i].weight > s[best].weight) best = i;
  }
  *top = s[best];
  *confidence = s[best].weight / total;
  return true;
}

float AccessPredictor::SuccList::Share(uint32_t node) const {
  float total = 0, mine = 0;
  for (uint8_t i = 0; i < n; ++i) {
    total += s[i].weight;
    if (s[i].node == node) mine = s[i].weight;
  }
  return total > 0 ? mine / total : 0;
}

void AccessPredictor::Recent::Push(uint32_t id) {
  std::move(n.begin() + 1, n.end(), n.begin());
  n.back() = id;
}

AccessPredictor::AccessPredictor(PredictorConfig config) : config_(config) {
  if (config_.max_streams == 0) config_.max_streams = 1;
  config_.long_order = std::min(config_.long_order, kMaxLongOrder);
}

bool AccessPredictor::LongKey(const Recent& r, uint64_t* key) const {
  if (config_.long_order <= 2) return false;
  uint64_t h = config_.long_order;
  for (uint32_t i = kMaxLongOrder - config_.long_order; i < kMaxLongOrder; ++i) {
    if (r.n[i] == kNone) return false;
    h = (h ^ r.n[i]) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  *key = h;
  return true;
}

uint32_t AccessPredictor::Intern(const Access& a) {
  NodeKey key{a.region, a.first_chunk, a.dir};
  if (nodes_.size() >= config_.max_nodes && !node_ids_.count(key)) {
    // Bounded memory (regions come and go; random faults create one-off targets): forget
    // everything and learn again. Streams keep their positions (the prefetcher's cursors stay
    // valid) and get a new plan epoch.
    nodes_.clear();
    node_ids_.clear();
    chunk_nodes_.clear();
    distinct_chunks_ = 0;
    order1_.clear();
    order2_.clear();
    order_long_.clear();
    for (auto& s : streams_) {
      ClearPlan(s);
      s.recent = s.tail = Recent();
      s.period = 0;
    }
    ++resets_;
  }
  auto [it, inserted] = node_ids_.try_emplace(key, static_cast<uint32_t>(nodes_.size()));
  const uint32_t id = it->second;
  if (inserted) {
    nodes_.push_back(Node{a.region, a.first_chunk, a.chunk_count, a.dir});
    order1_.emplace_back();
  } else {
    nodes_[id].chunk_count = a.chunk_count;
  }
  Node& node = nodes_[id];
  for (; node.mapped < node.chunk_count; ++node.mapped) {
    ChunkNodes& cn = ChunkNodesFor(ChunkKey{node.region, node.first_chunk + node.mapped});
    if (cn.first == kNone)
      cn.first = id;
    else
      cn.more.push_back(id);
  }
  return id;
}

AccessPredictor::StreamState& AccessPredictor::StreamFor(uint64_t stream) {
  for (auto& s : streams_)
    if (s.id == stream) return s;
  if (streams_.size() < config_.max_streams) {
    streams_.emplace_back();
    streams_.back().id = stream;
    return streams_.back();
  }
  auto oldest =
      std::min_element(streams_.begin(), streams_.end(),
                       [](const auto& a, const auto& b) { return a.last_use < b.last_use; });
  *oldest = StreamState();
  oldest->id = stream;
  return *oldest;
}

const AccessPredictor::StreamState* AccessPredictor::FindStream(uint64_t stream) const {
  for (const auto& s : streams_)
    if (s.id == stream) return &s;
  return nullptr;
}

bool AccessPredictor::Predict(const Recent& r, Succ* next, float* confidence) const {
  const SuccList* ctx = LongestKnown(r);
  return ctx && ctx->Top(next, confidence);
}

const AccessPredictor::SuccList* AccessPredictor::LongestKnown(const Recent& r) const {
  const uint32_t a = r.back(1), b = r.back(0);
  if (b == kNone) return nullptr;
  uint64_t key;
  if (LongKey(r, &key)) {
    auto it = order_long_.find(key);
    if (it != order_long_.end() && it->second.n) return &it->second;
  }
  if (a != kNone) {
    auto it = order2_.find(uint64_t{a} << 32 | b);
    if (it != order2_.end() && it->second.n) return &it->second;
  }
  return order1_[b].n ? &order1_[b] : nullptr;
}

bool AccessPredictor::Known(const Recent& r) const {
  const uint32_t a = r.back(1), b = r.back(0);
  if (a == kNone || b == kNone) return false;
  uint64_t key;
  if (LongKey(r, &key) && order_long_.count(key)) return true;
  auto it = order2_.find(uint64_t{a} << 32 | b);
  return it != order2_.end() && it->second.n > 0;
}

void AccessPredictor::PopFront(StreamState& s) {
  const Entry& e = s.plan.front();
  // The plan's first entry is its node's earliest.
  auto it = s.uses.find(e.node);
  if (it != s.uses.end()) {
    if (!it->second.empty() && it->second.front().raw_pos == e.raw_pos) it->second.pop_front();
    if (it->second.empty()) s.uses.erase(it);
  }
  s.plan_chunks -= e.chunk_count;
  s.plan.pop_front();
}

void AccessPredictor::TruncateAfter(StreamState& s, uint32_t a, uint32_t b) {
  // The first planned entry walked from a context ending in (a, b); plan[0] was walked from the
  // demand history, which is not planned, so start at 1. Entries whose longer context differs are
  // dropped too: walking them again is only work. Found through b's planned uses (plan positions
  // ascend strictly), not by a scan of the plan.
  auto it = s.uses.find(b);
  if (it == s.uses.end()) return;
  for (const NodeUse& u : it->second) {
    const size_t i = std::partition_point(s.plan.begin(), s.plan.end(),
                                          [&](const Entry& e) { return e.raw_pos < u.raw_pos; }) -
                     s.plan.begin();
    if (i + 1 >= s.plan.size()) return;
    if ((i == 0 ? s.recent.back() : s.plan[i - 1].node) == a) {
      TruncateFrom(s, i + 1);
      return;
    }
  }
}

void AccessPredictor::TruncateFrom(StreamState& s, size_t k) {
  while (s.plan.size() > k) {
    const Entry& e = s.plan.back();
    auto it = s.uses.find(e.node);
    if (it != s.uses.end()) {
      if (!it->second.empty() && it->second.back().raw_pos == e.raw_pos) it->second.pop_back();
      if (it->second.empty()) s.uses.erase(it);
    }
    s.plan_chunks -= e.chunk_count;
    s.plan.pop_back();
  }
  s.tail = s.recent;  // then the last entries kept (a context holds at most kMaxLongOrder nodes)
  for (size_t i = s.plan.size() - std::min<size_t>(s.plan.size(), kMaxLongOrder); i < s.plan.size();
       ++i)
    s.tail.Push(s.plan[i].node);
}

void AccessPredictor::ClearPlan(StreamState& s) {
  s.plan.clear();
  s.uses.clear();
  s.plan_chunks = 0;
  s.misses = 0;
  ++s.epoch;
}

void AccessPredictor::Extend(StreamState& s) {
  if (s.plan.empty()) s.tail = s.recent;
  // One period: the walk then reaches the next use of every access of the cycle, which is what
  // placement needs. A longer plan would only lag further behind the tables (it is walked ahead
  // of time); before a period was measured, as many accesses as contexts are known.
  const size_t period = s.period ? s.period : std::max<size_t>(order2_.size(), 1);
  const size_t cap_nodes = std::min<size_t>(config_.max_plan_nodes, period + 1);
  for (uint32_t walked = 0; walked < config_.walk_per_access && s.plan.size() < cap_nodes &&
                            s.plan_chunks < config_.max_plan_chunks;
       ++walked) {
    Succ next;
    float conf;
    if (!Predict(s.tail, &next, &conf)) return;
    Entry e;
    e.node = next.node;
    // As it was the last time it followed this context: a layer read whole in one order and in
    // halves in another has the count of the order walked.
    e.chunk_count = next.chunk_count;
    if (s.plan.empty()) {
      e.raw_pos = static_cast<uint64_t>(static_cast<int64_t>(s.pos) - s.shift);
      e.confidence = conf;
    } else {
      const Entry& back = s.plan.back();
      e.raw_pos = back.raw_pos + back.chunk_count;
      e.confidence = std::min(back.confidence, conf);
    }
    s.uses[e.node].push_back(NodeUse{e.raw_pos, e.chunk_count});
    s.plan_chunks += e.chunk_count;
    s.plan.push_back(e);
    s.tail.Push(e.node);
  }
}

void AccessPredictor::Observe(const Access& a) {
  ++tick_;
  const uint32_t id = Intern(a);
  StreamState& s = StreamFor(a.stream);
  s.last_use = tick_;

  // Learn: which node followed the stream's last one, last two and last long_order.
  const uint32_t prev2 = s.recent.back(1), prev1 = s.recent.back(0);
  if (prev1 != kNone) {
    Succ before{kNone, 0, 0}, after{kNone, 0, 0};
    float conf;
    const bool known = Predict(s.recent, &before, &conf);
    order1_[prev1].Observe(id, a.chunk_count);
    // Accesses since the context last occurred, by the longest order that saw it before.
    uint64_t since = 0;
    const uint64_t samples = recurrence_count_;
    auto seen = [&](SuccList& ctx) {
      if (ctx.last_seen) {
        since = s.accesses - ctx.last_seen;
        // Back after kStaleIntervals of its own intervals: what it learned belongs to an order
        // that has changed since (a context of the order before last). Its successors drop to
        // half an observation, so the new one takes over at once -- and should that one be
        // noise, the old order is back after one more observation.
        const bool stale = ctx.interval && since > kStaleIntervals * ctx.interval;
        if (stale)
          for (uint8_t k = 0; k < ctx.n; ++k) ctx.s[k].weight = std::min(ctx.s[k].weight, 0.5f);
        ctx.interval = since;
        if (stale) since = 0;  // not the period of any order
        // A sample of the period in chunks (for NextUseDistance's fallback and the hedge): a
        // context that came back within about one period.
        if (since && (!s.period || since <= s.period + s.period / 2))
          recurrences_[recurrence_count_++ % kPeriodSamples] = clock_ - ctx.last_clock;
      }
      ctx.last_seen = s.accesses;
      ctx.last_clock = clock_;
      ctx.Observe(id, a.chunk_count);
    };
    if (prev2 != kNone) {
      SuccList& ctx = order2_[uint64_t{prev2} << 32 | prev1];
      seen(ctx);
    }
    uint64_t key;
    if (LongKey(s.recent, &key)) {
      // Bounded memory: noise makes new long contexts all the time. Forgetting them costs one
      // pass of relearning; the shorter orders predict meanwhile.
      if (order_long_.size() >= config_.max_long_contexts && !order_long_.count(key))
        order_long_.clear();
      SuccList& ctx = order_long_[key];
      seen(ctx);
    }
    if (recurrence_count_ != samples) UpdatePeriod();
    Predict(s.recent, &after, &conf);
    // The context now predicts another successor: the plan was walked with the old one.
    if (known && (before.node != after.node || before.chunk_count != after.chunk_count))
      TruncateAfter(s, prev2, prev1);
    // The distance since the context last occurred is the period of the order. Kept as a slowly
    // decaying maximum: a layer read twice in a row ("A B A B") measures 2 for its short context,
    // which must not shrink the plan to three accesses.
    if (since) s.period = std::max<uint64_t>(since, s.period - s.period / 8);
  }
  ++s.accesses;

  // When the access's first chunk was last read (0: never), before its history moves on.
  const uint64_t last_read = ChunkNodesFor(ChunkKey{a.region, a.first_chunk}).seen.back();
  // Every chunk's history (Intern created its entry).
  for (uint64_t c = 0; c < a.chunk_count;) {
    ChunkPage& page = *chunk_nodes_[a.region][(a.first_chunk + c) / kChunkPage];
    for (uint64_t i = (a.first_chunk + c) % kChunkPage; i < kChunkPage && c < a.chunk_count;
         ++i, ++c) {
      auto& seen = page[i].seen;
      distinct_chunks_ += seen.back() == 0;
      std::move(seen.begin() + 1, seen.end(), seen.begin());
      seen.back() = clock_ + c + 1;
    }
  }
  clock_ += a.chunk_count;
  last_chunks_ = a.chunk_count;

  // Advance the plan.
  bool rewalk = false;
  bool planned = false;  // the access was the plan's head
  s.pos += a.chunk_count;
  if (!s.plan.empty()) {
    const size_t window = std::min<size_t>(config_.resync_window, s.plan.size());
    size_t j = 0;
    while (j < window && s.plan[j].node != id) ++j;
    planned = j == 0;
    if (j < window) {
      const Entry e = s.plan[j];
      for (size_t k = 0; k <= j; ++k) PopFront(s);
      // The entry after `e` is next: realign planned positions with the real one (inserted or
      // skipped accesses, a chunk count that changed).
      s.shift = static_cast<int64_t>(s.pos) - static_cast<int64_t>(e.raw_pos + e.chunk_count);
      s.misses = 0;
      // Skipped entries: the rest of the plan was walked from contexts that contain them. If the
      // demand's own context was seen before (the skip is part of an order, not a one-off), the
      // plan is walked again from it below; otherwise the plan is the better guess. (A plan
      // walked from an order that read each layer in halves, when the demand reads whole layers
      // again, matches every other entry -- the first half's node is the layer's -- and is thus
      // replaced, as is one that still walks a layer no longer read.)
      rewalk = j > 0;
    } else if (++s.misses >= 2) {
      ClearPlan(s);
    }
  }
  // An unplanned re-read of data read moments ago (its first chunk within two accesses' worth of
  // chunks): the order has layers read twice that the plan does not know yet. Hedge for half a
  // period (see NextUseDistance).
  if (!planned && last_read && period_chunks_) {
    const uint64_t d = clock_ - a.chunk_count - (last_read - 1);
    if (d <= 2 * uint64_t{a.chunk_count}) {
      repeat_chunks_ = clock_ < hedge_until_ ? std::max(repeat_chunks_, d) : d;
      hedge_until_ = clock_ + period_chunks_ / 2;
    }
  }
  s.recent.Push(id);
  // A repeat the plan does not name but the context has seen (a layer the order reads twice,
  // whose second read a skip made the context forget): see NextUseDistance.
  repeat_share_ = 0;
  if (const SuccList* ctx = LongestKnown(s.recent)) {
    Succ top;
    float conf;
    ctx->Top(&top, &conf);
    if (top.node != id) repeat_share_ = ctx->Share(id);
  }
  if (rewalk && Known(s.recent)) TruncateFrom(s, 0);
  Extend(s);
}

PlannedAccess AccessPredictor::ToPlanned(const StreamState& s, const Entry& e) const {
  const Node& node = nodes_[e.node];
  PlannedAccess p;
  // The larger of the planned count and the node's latest (a growing KV cache read).
  p.access = Access{node.region, node.first_chunk, std::max(e.chunk_count, node.chunk_count),
                    node.dir, s.id};
  const int64_t pos = static_cast<int64_t>(e.raw_pos) + s.shift;
  p.pos = pos > 0 ? static_cast<uint64_t>(pos) : 0;
  p.confidence = e.confidence;
  return p;
}

bool AccessPredictor::PredictNext(uint64_t stream, PlannedAccess* out) const {
  const StreamState* s = FindStream(stream);
  if (!s || s->plan.empty()) return false;
  *out = ToPlanned(*s, s->plan.front());
  return true;
}

void AccessPredictor::Plan(uint64_t stream, uint64_t from_pos, uint64_t until_pos,
                           float min_confidence, std::vector<PlannedAccess>* out) const {
  const StreamState* s = FindStream(stream);
  if (!s) return;
  const int64_t from_raw = static_cast<int64_t>(from_pos) - s->shift;
  const int64_t until_raw = static_cast<int64_t>(until_pos) - s->shift;
  auto it = std::partition_point(s->plan.begin(), s->plan.end(), [&](const Entry& e) {
    return static_cast<int64_t>(e.raw_pos + e.chunk_count) <= from_raw;
  });
  for (; it != s->plan.end() && static_cast<int64_t>(it->raw_pos) < until_raw; ++it) {
    if (it->confidence < min_confidence) break;
    out->push_back(ToPlanned(*s, *it));
  }
}

uint64_t AccessPredictor::Position(uint64_t stream) const {
  const StreamState* s = FindStream(stream);
  return s ? s->pos : 0;
}

uint64_t AccessPredictor::PlanEpoch(uint64_t stream) const {
  const StreamState* s = FindStream(stream);
  return s ? s->epoch : 0;
}

const AccessPredictor::ChunkNodes* AccessPredictor::FindChunkNodes(const ChunkKey& key) const {
  auto it = chunk_nodes_.find(key.region);
  if (it == chunk_nodes_.end()) return nullptr;
  const uint64_t page = key.chunk / kChunkPage;
  if (page >= it->second.size() || !it->second[page]) return nullptr;
  const ChunkNodes& cn = (*it->second[page])[key.chunk % kChunkPage];
  return cn.first == kNone ? nullptr : &cn;
}

AccessPredictor::ChunkNodes& AccessPredictor::ChunkNodesFor(const ChunkKey& key) {
  std::vector<std::unique_ptr<ChunkPage>>& pages = chunk_nodes_[key.region];
  const uint64_t page = key.chunk / kChunkPage;
  if (page >= pages.size()) pages.resize(page + 1);
  if (!pages[page]) pages[page] = std::make_unique<ChunkPage>();
  return (*pages[page])[key.chunk % kChunkPage];
}

void AccessPredictor::UpdatePeriod() {
  const size_t n = std::min<uint64_t>(recurrence_count_, kPeriodSamples);
  std::array<uint64_t, kPeriodSamples> v;
  std::copy_n(recurrences_.begin(), n, v.begin());
  std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
  period_chunks_ = v[n / 2];
}

bool AccessPredictor::Learning() const {
  return period_chunks_ == 0 && clock_ <= kLearningReads * distinct_chunks_;
}

uint64_t AccessPredictor::NextUseDistance(const ChunkKey& key) const {
  uint64_t best = kNeverUsed;
  const ChunkNodes* found = FindChunkNodes(key);
  if (!found) return best;
  const ChunkNodes& cn = *found;
  for (const auto& s : streams_) {
    // A CPU-fault block is observed at its first fault (Prefetcher::OnFault): the rest of the
    // latest one is being read right now.
    if (const uint32_t last = s.recent.back(); last != kNone) {
      const Node& n = nodes_[last];
      if (n.dir == Direction::kCpuFault && n.region == key.region && key.chunk >= n.first_chunk &&
          key.chunk < n.first_chunk + n.chunk_count)
        return 0;
    }
    if (s.uses.empty()) continue;
    for (size_t k = 0; k <= cn.more.size(); ++k) {
      const uint32_t id = k == 0 ? cn.first : cn.more[k - 1];
      auto it = s.uses.find(id);
      if (it == s.uses.end()) continue;
      const uint64_t offset = key.chunk - nodes_[id].first_chunk;
      // The node's earliest planned entry that covers the chunk (as planned, or as the node's
      // latest access when that is longer: a growing KV cache read).
      const uint32_t latest = nodes_[id].chunk_count;
      for (const NodeUse& u : it->second) {
        if (offset >= std::max(u.chunk_count, latest)) continue;
        const int64_t at = static_cast<int64_t>(u.raw_pos + offset) + s.shift;
        const uint64_t d = at > static_cast<int64_t>(s.pos) ? static_cast<uint64_t>(at) - s.pos : 0;
        best = std::min(best, d);
        break;
      }
    }
  }
  if (clock_ < hedge_until_) {
    // Hedging: a chunk read within the last repeat distance may be read again that far after its
    // read (counted from the start of the latest access, whose chunks are being served now).
    const uint64_t q = cn.seen.back();
    if (q && q - 1 + repeat_chunks_ >= clock_)
      best = std::min(best, q - 1 + repeat_chunks_ - (clock_ - last_chunks_));
  }
  if (repeat_share_ >= kRepeatShare) {
    // The latest access may be read again right after itself: its chunks are kept through one
    // more access, the less likely the repeat the further away (distance over share).
    const uint64_t q = cn.seen.back();
    if (q && q - 1 + last_chunks_ >= clock_) {
      const uint64_t d = q - 1 + last_chunks_ - (clock_ - last_chunks_);
      best = std::min(best, static_cast<uint64_t>(static_cast<float>(d) / repeat_share_));
    }
  }
  if (best == kNeverUsed && period_chunks_) {
    // No plan names the chunk (the plan was just rebuilt, or walks other nodes after an order
    // change): the chunk's own history, repeated one period later. Its first access within the
    // last period, or overdue by at most 1/kOverdueShare of one (the pass may run longer than
    // the median), comes back first; an overdue one is due now.
    const uint64_t overdue = period_chunks_ / kOverdueShare;
    for (uint64_t q : cn.seen) {
      if (q == 0 || q - 1 + period_chunks_ + overdue < clock_) continue;
      best = q - 1 + period_chunks_ > clock_ ? q - 1 + period_chunks_ - clock_ : 0;
      break;
    }
  }
  return best;
}

}  // namespace zrtier::policy
