#include "runtime/policy/access_predictor.h"

#include <algorithm>

namespace zrtier::policy {

void AccessPredictor::SuccList::Observe(uint32_t node) {
  bool found = false;
  uint8_t kept = 0;
  for (uint8_t i = 0; i < n; ++i) {
    Succ e = s[i];
    if (e.node == node) {
      e.weight = std::min(e.weight + 1.0f, kMaxWeight);
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
    s[n++] = Succ{node, 1.0f};
    return;
  }
  uint8_t lightest = 0;
  for (uint8_t i = 1; i < n; ++i)
    if (s[i].weight < s[lightest].weight) lightest = i;
  s[lightest] = Succ{node, 1.0f};
}

bool AccessPredictor::SuccList::Top(uint32_t* node, float* confidence) const {
  if (n == 0) return false;
  float total = 0;
  uint8_t best = 0;
  for (uint8_t i = 0; i < n; ++i) {
    total += s[i].weight;
    if (s[i].weight > s[best].weight) best = i;
  }
  *node = s[best].node;
  *confidence = s[best].weight / total;
  return true;
}

AccessPredictor::AccessPredictor(PredictorConfig config) : config_(config) {
  if (config_.max_streams == 0) config_.max_streams = 1;
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
    order1_.clear();
    order2_.clear();
    for (auto& s : streams_) {
      ClearPlan(s);
      s.prev2 = s.prev1 = s.tail2 = s.tail1 = kNone;
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

bool AccessPredictor::Predict(uint32_t a, uint32_t b, uint32_t* next, float* confidence) const {
  if (b == kNone) return false;
  if (a != kNone) {
    auto it = order2_.find(uint64_t{a} << 32 | b);
    if (it != order2_.end() && it->second.Top(next, confidence)) return true;
  }
  return order1_[b].Top(next, confidence);
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
  // The first planned entry walked from context (a, b); the context of plan[0] is the tail of the
  // demand history, which is not planned, so start at 2.
  size_t k = 2;
  while (k < s.plan.size() && !(s.plan[k - 2].node == a && s.plan[k - 1].node == b)) ++k;
  if (k >= s.plan.size()) return;
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
  s.tail2 = a;
  s.tail1 = b;
}

void AccessPredictor::ClearPlan(StreamState& s) {
  s.plan.clear();
  s.uses.clear();
  s.plan_chunks = 0;
  s.misses = 0;
  ++s.epoch;
}

void AccessPredictor::Extend(StreamState& s) {
  if (s.plan.empty()) {
    s.tail2 = s.prev2;
    s.tail1 = s.prev1;
  }
  // One period: the walk then reaches the next use of every access of the cycle, which is what
  // placement needs. A longer plan would only lag further behind the tables (it is walked ahead
  // of time); before a period was measured, as many accesses as contexts are known.
  const size_t period = s.period ? s.period : std::max<size_t>(order2_.size(), 1);
  const size_t cap_nodes = std::min<size_t>(config_.max_plan_nodes, period + 1);
  while (s.plan.size() < cap_nodes && s.plan_chunks < config_.max_plan_chunks) {
    uint32_t next;
    float conf;
    if (!Predict(s.tail2, s.tail1, &next, &conf)) return;
    Entry e;
    e.node = next;
    e.chunk_count = nodes_[next].chunk_count;
    if (s.plan.empty()) {
      e.raw_pos = static_cast<uint64_t>(static_cast<int64_t>(s.pos) - s.shift);
      e.confidence = conf;
    } else {
      const Entry& back = s.plan.back();
      e.raw_pos = back.raw_pos + back.chunk_count;
      e.confidence = std::min(back.confidence, conf);
    }
    s.uses[next].push_back(NodeUse{e.raw_pos, e.chunk_count});
    s.plan_chunks += e.chunk_count;
    s.plan.push_back(e);
    s.tail2 = s.tail1;
    s.tail1 = next;
  }
}

void AccessPredictor::Observe(const Access& a) {
  ++tick_;
  const uint32_t id = Intern(a);
  StreamState& s = StreamFor(a.stream);
  s.last_use = tick_;

  // Learn: which node followed the stream's last one (and last two).
  if (s.prev1 != kNone) {
    order1_[s.prev1].Observe(id);
    if (s.prev2 != kNone) {
      SuccList& ctx = order2_[uint64_t{s.prev2} << 32 | s.prev1];
      uint32_t before = kNone, after = kNone;
      float conf;
      const bool known = ctx.Top(&before, &conf);
      ctx.Observe(id);
      ctx.Top(&after, &conf);
      // The context now predicts another successor: the plan was walked with the old one.
      if (known && before != after) TruncateAfter(s, s.prev2, s.prev1);
      // The distance since this context last occurred is the period of the order. Kept as a
      // slowly decaying maximum: a layer read twice in a row ("A B A B") measures 2 for its
      // context, which must not shrink the plan to three accesses.
      if (ctx.last_seen)
        s.period = std::max<uint64_t>(s.accesses - ctx.last_seen, s.period - s.period / 8);
      ctx.last_seen = s.accesses;
    }
  }
  ++s.accesses;

  // Advance the plan.
  s.pos += a.chunk_count;
  if (!s.plan.empty()) {
    const size_t window = std::min<size_t>(config_.resync_window, s.plan.size());
    size_t j = 0;
    while (j < window && s.plan[j].node != id) ++j;
    if (j < window) {
      const Entry e = s.plan[j];
      for (size_t k = 0; k <= j; ++k) PopFront(s);
      // The entry after `e` is next: realign planned positions with the real one (inserted or
      // skipped accesses, a chunk count that changed).
      s.shift = static_cast<int64_t>(s.pos) - static_cast<int64_t>(e.raw_pos + e.chunk_count);
      s.misses = 0;
    } else if (++s.misses >= 2) {
      ClearPlan(s);
    }
  }
  s.prev2 = s.prev1;
  s.prev1 = id;
  Extend(s);
}

PlannedAccess AccessPredictor::ToPlanned(const StreamState& s, const Entry& e) const {
  const Node& node = nodes_[e.node];
  PlannedAccess p;
  // The latest chunk count of the node (a growing KV cache read), not the one planned.
  p.access = Access{node.region, node.first_chunk, node.chunk_count, node.dir, s.id};
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

uint64_t AccessPredictor::NextUseDistance(const ChunkKey& key) const {
  uint64_t best = kNeverUsed;
  const ChunkNodes* found = FindChunkNodes(key);
  if (!found) return best;
  const ChunkNodes& cn = *found;
  for (const auto& s : streams_) {
    if (s.uses.empty()) continue;
    for (size_t k = 0; k <= cn.more.size(); ++k) {
      const uint32_t id = k == 0 ? cn.first : cn.more[k - 1];
      auto it = s.uses.find(id);
      if (it == s.uses.end()) continue;
      const uint64_t offset = key.chunk - nodes_[id].first_chunk;
      // The node's earliest planned entry that covers the chunk (as planned; a grown node's
      // older entries may be shorter).
      for (const NodeUse& u : it->second) {
        if (offset >= u.chunk_count) continue;
        const int64_t at = static_cast<int64_t>(u.raw_pos + offset) + s.shift;
        const uint64_t d = at > static_cast<int64_t>(s.pos) ? static_cast<uint64_t>(at) - s.pos : 0;
        best = std::min(best, d);
        break;
      }
    }
  }
  return best;
}

}  // namespace zrtier::policy
