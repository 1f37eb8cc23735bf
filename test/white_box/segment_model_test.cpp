// Randomized model test of the segment heap: thousands of random carves, give-backs, trims and
// injected faults on several streams, each checked against a reference model kept outside the
// heap: the pieces handed out (no two overlap; exactly the heap's used ranges), the byte
// accounting (used + free = committed = what the backend holds, seen by a tracking adaptor),
// each piece's owner stamps (intact until given back: nothing else wrote or decommitted them),
// and the streams every byte was last used on (each carve must return a wait for each of them).
// Trims decommit free commits anywhere, so segments get holes, which later growth commits again;
// check() verifies after every trim that all it could give back went.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <vector>

#include <refpool/error.hpp>
#include "support/fault_injection.hpp"

#include "white_box/segment_fixture.hpp"

using namespace refpool;
using detail::placement;
using detail::segment_heap;
using detail::stream_set;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;

namespace {

/// Streams that may still use each byte that is free: disjoint intervals, each with a set of
/// stream numbers.
class stream_history {
 public:
  void assign(std::uintptr_t a, std::uintptr_t b, const std::set<std::uintptr_t>& streams) {
    erase(a, b);
    if (!streams.empty()) intervals_[a] = {b, streams};
  }
  void erase(std::uintptr_t a, std::uintptr_t b) {
    split_at(a);
    split_at(b);
    intervals_.erase(intervals_.lower_bound(a), intervals_.lower_bound(b));
  }
  std::set<std::uintptr_t> streams_in(std::uintptr_t a, std::uintptr_t b) const {
    std::set<std::uintptr_t> out;
    auto it = intervals_.upper_bound(a);
    if (it != intervals_.begin()) --it;
    for (; it != intervals_.end() && it->first < b; ++it)
      if (it->second.first > a) out.insert(it->second.second.begin(), it->second.second.end());
    return out;
  }
  void clear() { intervals_.clear(); }

 private:
  void split_at(std::uintptr_t x) {
    auto it = intervals_.upper_bound(x);
    if (it == intervals_.begin()) return;
    --it;
    if (it->first < x && x < it->second.first) {
      intervals_[x] = {it->second.first, it->second.second};
      it->second.first = x;
    }
  }
  std::map<std::uintptr_t, std::pair<std::uintptr_t, std::set<std::uintptr_t>>> intervals_;
};

struct live_piece {
  segment_heap::piece p;
  std::uint64_t id;
  std::uintptr_t stream;
};

struct config {
  const char* name;
  detail::segment_heap_options options;
  std::size_t limit;
};

std::vector<config> configs() {
  auto plain = test::plain_options();
  auto vm_small = test::vm_options(48 * MiB, 16 * MiB);
  auto vm_default = detail::segment_heap_options{};
  return {{"virtual memory, 48 MiB reservations", vm_small, 160 * MiB},
          {"backend allocations", plain, 160 * MiB},
          {"virtual memory, default options", vm_default, 96 * MiB}};
}

std::size_t random_size(std::mt19937_64& rng) {
  const unsigned pick = static_cast<unsigned>(rng() % 100);
  const std::size_t max = pick < 50 ? 64 * KiB : pick < 80 ? 1 * MiB : pick < 97 ? 8 * MiB : 24 * MiB;
  return 1 + rng() % max;
}

// Streams 0..3 most of the time, sometimes 4..13, so that ranges also pass the set's bound.
std::uintptr_t random_stream(std::mt19937_64& rng) { return rng() % 10 == 0 ? 4 + rng() % 10 : rng() % 4; }

stream_ref as_stream(std::uintptr_t n) { return test::stream(n); }

}  // namespace

TEST_CASE("random carves, give-backs, trims and faults against a model", "[segments][model]") {
  for (const config& cfg : configs()) {
    for (std::uint64_t seed = 1; seed <= 2; ++seed) {
      INFO(cfg.name << ", seed " << seed);
      heap_fixture f(cfg.limit);
      segment_heap heap(f.be, cfg.options);
      std::mt19937_64 rng(seed);
      std::vector<live_piece> live;
      std::map<std::uintptr_t, std::size_t> by_address;  // start -> bytes, of live pieces
      stream_history history;
      std::uint64_t next_id = 1;
      std::size_t used = 0;
      std::size_t carves = 0, out_of_memory = 0, thrown = 0, trims = 0, any_waits = 0, waits_checked = 0;
      std::size_t holes_seen = 0;

      const auto check_all = [&](bool stamps) {
        heap.check();
        const auto st = heap.stats();
        REQUIRE(st.used_bytes == used);
        REQUIRE(st.pieces_out == live.size());
        REQUIRE(st.used_bytes + st.free_bytes == st.committed_bytes);
        REQUIRE(st.committed_bytes == f.tracker->held());
        REQUIRE(f.be.outstanding_bytes() == f.tracker->held());
        // The heap's used ranges are exactly the model's pieces.
        std::map<std::uintptr_t, std::size_t> heap_pieces;
        for (const auto& r : heap.ranges())
          if (!r.free) heap_pieces[r.address] = r.bytes;
        REQUIRE(heap_pieces == by_address);
        if (stamps)
          for (const auto& l : live) REQUIRE(test::stamped(l.p, l.id));
      };

      for (int op = 0; op < 4000; ++op) {
        const unsigned what = static_cast<unsigned>(rng() % 100);
        const bool full = used > cfg.limit / 2;
        if (what < 3) {
          const auto how = rng() % 2 ? fault_schedule::failure::out_of_memory : fault_schedule::failure::backend_error;
          f.failing->arm(1 + rng() % 3, 1, how);
        } else if (what < 6) {
          const auto before = heap.ranges();
          const std::size_t committed = heap.stats().committed_bytes;
          const std::size_t keep = rng() % 2 ? 0 : rng() % (16 * MiB);
          const std::size_t given = heap.trim(keep);
          ++trims;
          REQUIRE(heap.stats().committed_bytes == committed - given);
          REQUIRE((heap.stats().free_bytes <= keep || given == 0 || heap.stats().free_bytes < committed - used));
          // Bytes no longer in any range went back (with no work in flight): no streams.
          std::map<std::uintptr_t, std::uintptr_t> now;
          for (const auto& r : heap.ranges()) now[r.address] = r.address + r.bytes;
          for (const auto& r : before) {
            if (!r.free) continue;
            std::uintptr_t cursor = r.address;
            const std::uintptr_t end = r.address + r.bytes;
            while (cursor < end) {
              auto it = now.upper_bound(cursor);
              if (it != now.begin() && std::prev(it)->second > cursor) {
                cursor = std::min(end, std::prev(it)->second);
              } else {
                const std::uintptr_t stop = it == now.end() ? end : std::min(end, it->first);
                history.erase(cursor, stop);
                cursor = stop;
              }
            }
          }
          check_all(true);  // decommitting a used byte would have zeroed a stamp
          // Holes: two ranges of one segment in a row that do not touch (trim decommitted between).
          const auto after = heap.ranges();
          for (std::size_t k = 1; k < after.size(); ++k)
            if (after[k].segment == after[k - 1].segment &&
                after[k].address != after[k - 1].address + after[k - 1].bytes)
              ++holes_seen;
        } else if (what < 7) {
          heap.forget_streams();
          history.clear();
        } else if (!live.empty() && (what < 45 || full)) {
          const std::size_t i = rng() % live.size();
          live_piece l = live[i];
          REQUIRE(test::stamped(l.p, l.id));
          std::set<std::uintptr_t> streams{l.stream};
          stream_set used_on(as_stream(l.stream));
          if (rng() % 5 == 0) {  // recorded on another stream too
            const std::uintptr_t extra = random_stream(rng);
            streams.insert(extra);
            used_on.add(as_stream(extra));
          }
          heap.give_back(l.p, used_on);
          history.assign(test::addr(l.p), test::addr(l.p) + l.p.bytes, streams);
          by_address.erase(test::addr(l.p));
          used -= l.p.bytes;
          live[i] = live.back();
          live.pop_back();
        } else {
          const std::size_t bytes = random_size(rng);
          const std::uintptr_t s = random_stream(rng);
          const auto where = rng() % 8 == 0 ? placement::one_physical_allocation : placement::anywhere;
          const bool only_free = rng() % 5 == 0;
          const auto before = heap.ranges();
          const auto injected = f.failing->injected();
          const auto refusals = f.tracker->refusals();
          std::optional<segment_heap::carved> c;
          bool threw = false;
          try {
            c = only_free ? heap.carve_free(bytes, as_stream(s), where) : heap.carve(bytes, as_stream(s), where);
          } catch (const backend_error&) {
            threw = true;
          }
          if (!c) {
            // A failure changes nothing, and is explained: an injected fault, a refusal by the
            // limit, or (carve_free) no free range that fits.
            const auto after = heap.ranges();
            REQUIRE(after.size() == before.size());
            for (std::size_t k = 0; k < after.size(); ++k) {
              REQUIRE(after[k].address == before[k].address);
              REQUIRE(after[k].bytes == before[k].bytes);
              REQUIRE(after[k].free == before[k].free);
            }
            if (threw) {
              REQUIRE(f.failing->injected() == injected + 1);
              ++thrown;
            } else if (!only_free) {
              REQUIRE((f.failing->injected() == injected + 1 || f.tracker->refusals() > refusals));
              ++out_of_memory;
            }
            REQUIRE(f.tracker->refusals() - refusals + f.failing->injected() - injected <= 1);
          } else {
            ++carves;
            const segment_heap::piece& p = c->p;
            const std::uintptr_t a = test::addr(p);
            REQUIRE(p.bytes == heap.piece_bytes(bytes));
            REQUIRE(a % 256 == 0);
            // No overlap with any live piece.
            auto next = by_address.lower_bound(a);
            if (next != by_address.end()) REQUIRE(next->first >= a + p.bytes);
            if (next != by_address.begin()) REQUIRE(std::prev(next)->first + std::prev(next)->second <= a);
            if (where == placement::one_physical_allocation) REQUIRE(heap.physical_allocations(p) == 1);
            // Every stream that may still use these bytes is waited for (the asking one needs no wait).
            const auto required = history.streams_in(a, a + p.bytes);
            if (c->waits.any()) {
              ++any_waits;
            } else {
              for (const std::uintptr_t r : required) {
                if (r == s) continue;
                ++waits_checked;
                INFO("piece at " << a << " of " << p.bytes << " B needs a wait for stream " << r);
                REQUIRE(c->waits.contains(as_stream(r)));
              }
            }
            REQUIRE((c->waits.any() || !c->waits.contains(as_stream(s))));
            history.erase(a, a + p.bytes);
            test::stamp(p, next_id);
            live.push_back({p, next_id++, s});
            by_address[a] = p.bytes;
            used += p.bytes;
          }
        }
        check_all(op % 64 == 0);
      }
      check_all(true);
      for (const auto& l : live) heap.give_back(l.p, as_stream(l.stream));
      f.failing->disarm();
      heap.free_all();
      CHECK(f.tracker->held() == 0);
      CHECK(f.tracker->reserved() == 0);
      CHECK(f.tracker->bad_releases() == 0);
      CHECK(f.be.outstanding_bytes() == 0);
      // The run reached every path it claims to test.
      CHECK(carves > 1000);
      CHECK(out_of_memory > 0);
      CHECK(thrown > 0);
      CHECK(trims > 50);
      CHECK(waits_checked > 100);
      const auto st = heap.stats();
      CHECK(st.events.merges > 100);
      CHECK(st.events.segments_freed + st.events.decommits > 0);
      if (cfg.options.use_virtual_memory) CHECK(st.events.grows > 0);
      if (cfg.options.use_virtual_memory) CHECK(holes_seen > 0);  // trim decommitted commits in the middle
      (void)any_waits;
    }
  }
}
