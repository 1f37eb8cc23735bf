// Randomized model test of spans and pieces together (lib/segments/span.hpp): random carves,
// give-backs, spans made, idled, held again, grown, given back and yielded, trims and injected
// faults, checked against a model kept outside the heap: what is out (pieces and placed spans
// never overlap, and are exactly the heap's ranges that are not free), the owners' stamps (a held
// or idle span keeps its bytes until it yields; a span held again at home that was never touched
// meanwhile keeps them too), the streams a yielded span leaves (a piece carved from its bytes
// waits for them), and the byte accounting against what the backend holds.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include <refpool/error.hpp>

#include "support/fault_injection.hpp"
#include "white_box/segment_fixture.hpp"

using namespace refpool;
using detail::segment_heap;
using detail::segment_span;
using detail::stream_set;
using refpool::test::heap_fixture;
using refpool::test::KiB;
using refpool::test::MiB;
using state = segment_span::state;

namespace {

struct owned {
  segment_heap::piece p;  ///< a piece, or a span's bytes while placed
  segment_span* span = nullptr;
  std::uint64_t id = 0;
};

segment_heap::piece bytes_of(const segment_span& s) { return {s.address(), s.bytes, 0, s.node}; }

std::size_t random_size(std::mt19937_64& rng) {
  const unsigned pick = static_cast<unsigned>(rng() % 100);
  return 1 + rng() % (pick < 40 ? 64 * KiB : pick < 70 ? MiB : pick < 95 ? 8 * MiB : 20 * MiB);
}

}  // namespace

TEST_CASE("random spans and pieces against a model", "[segments][spans][model]") {
  // Operations a run: fewer under the sanitizers (test/meson.build), so CI's passes stay short.
  const char* ops_env = std::getenv("REFPOOL_SPAN_MODEL_OPS");
  const int ops = ops_env != nullptr ? std::atoi(ops_env) : 1000;
  // What the runs reached, over every seed: each path this test claims to check.
  std::size_t yields = 0, yields_seen = 0, home_again = 0, extended = 0, waits_checked = 0, failures = 0;
  for (const bool vm : {true, false}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      INFO((vm ? "virtual memory" : "backend allocations") << ", seed " << seed);
      heap_fixture f(192 * MiB);
      segment_heap heap(f.be, vm ? test::vm_options(96 * MiB, SIZE_MAX) : test::plain_options());
      std::mt19937_64 rng(seed);
      std::vector<owned> out;  // pieces and spans (placed or yielded)
      std::uint64_t next_id = 1;

      const auto check_all = [&](bool stamps) {
        heap.check();
        bool intact = true;
        std::map<std::uintptr_t, std::size_t> model;
        std::size_t pieces = 0, spanned = 0;
        for (const owned& o : out) {
          if (o.span != nullptr && !o.span->placed()) continue;
          const auto p = o.span != nullptr ? bytes_of(*o.span) : o.p;
          intact = intact && model.emplace(test::addr(p), p.bytes).second;
          (o.span != nullptr ? spanned : pieces) += p.bytes;
          intact = intact && (!stamps || test::stamped(p, o.id));
        }
        REQUIRE(intact);
        std::uintptr_t last_end = 0;
        for (const auto& [a, n] : model) {
          intact = intact && a >= last_end;  // nothing out overlaps
          last_end = a + n;
        }
        REQUIRE(intact);
        std::map<std::uintptr_t, std::size_t> in_heap;
        for (const auto& r : heap.ranges())
          if (!r.free) in_heap[r.address] = r.bytes;
        REQUIRE(in_heap == model);
        const auto st = heap.stats();
        REQUIRE(st.used_bytes == pieces);
        REQUIRE(st.span_bytes == spanned);
        REQUIRE(st.used_bytes + st.span_bytes + st.free_bytes == st.committed_bytes);
        REQUIRE(st.committed_bytes == f.tracker->held());
      };
      const auto give_back = [&](std::size_t i) {
        owned o = out[i];
        out[i] = out.back();
        out.pop_back();
        if (o.span == nullptr) {
          REQUIRE(test::stamped(o.p, o.id));
          heap.give_back(o.p, test::stream(1 + o.id % 3));
        } else {
          heap.give_back_span(o.span, test::stream(1 + o.id % 3));
        }
      };

      for (int op = 0; op < ops; ++op) {
        const unsigned what = static_cast<unsigned>(rng() % 100);
        const std::size_t i = out.empty() ? 0 : rng() % out.size();
        segment_span* s = out.empty() ? nullptr : out[i].span;
        try {
          if (what < 2) {
            f.failing->arm(1 + rng() % 3, 1,
                           rng() % 2 ? fault_schedule::failure::out_of_memory : fault_schedule::failure::backend_error);
          } else if (what < 6) {
            heap.trim(rng() % 2 ? 0 : rng() % (8 * MiB));
          } else if (what < 8) {
            heap.yield_idle_spans();
          } else if (what < 35 && !out.empty()) {
            give_back(i);
          } else if (what < 45 && s != nullptr && s->now == state::held) {
            heap.idle_span(*s, stream_set(test::stream(7)));  // its last users: stream 7
          } else if (what < 58 && s != nullptr && s->now != state::held) {
            const state was = s->now;
            const std::uintptr_t home = s->home;
            const auto h = heap.hold_span(*s, test::stream(1));
            if (!h) {
              REQUIRE(s->now == state::yielded);
              ++failures;
            } else if (was == state::yielded) {
              ++yields_seen;
              if (!h->moved) {
                REQUIRE(s->home == home);
                ++home_again;
              }
              test::stamp(bytes_of(*s), out[i].id);  // its bytes were free: its owner starts over
            } else {
              REQUIRE(s->home == home);  // idle, never yielded: the same bytes, stamps intact
            }
          } else if (what < 64 && s != nullptr && s->now == state::held) {
            const std::size_t old = s->bytes;
            if (heap.extend_span(*s, old + random_size(rng), test::stream(1))) {
              ++extended;
              test::stamp(bytes_of(*s), out[i].id);
            }
          } else if (what < 72) {
            if (auto c = heap.carve_span(random_size(rng), test::stream(1))) {
              out.push_back({{}, c->span, next_id++});
              test::stamp(bytes_of(*c->span), out.back().id);
            } else {
              ++failures;
            }
          } else {
            std::vector<const segment_span*> idle;
            for (const owned& o : out)
              if (o.span != nullptr && o.span->now == state::idle) idle.push_back(o.span);
            if (auto c = heap.carve(random_size(rng), test::stream(2))) {
              // Bytes a span left in this carve carry its last users' stream (7).
              for (const segment_span* y : idle)
                if (!y->placed() && !c->waits.any() && y->home < test::addr(c->p) + c->p.bytes &&
                    test::addr(c->p) < y->home + y->bytes) {
                  ++waits_checked;
                  REQUIRE(c->waits.contains(test::stream(7)));
                }
              out.push_back({c->p, nullptr, next_id++});
              test::stamp(c->p, out.back().id);
            } else {
              ++failures;
            }
          }
        } catch (const backend_error&) {
          ++failures;
        }
        check_all(op % 16 == 0);
      }
      check_all(true);
      yields += heap.stats().events.span_yields;
      f.failing->disarm();
      while (!out.empty()) give_back(out.size() - 1);
      heap.free_all();
      CHECK(f.tracker->held() == 0);
      CHECK(f.tracker->reserved() == 0);
      CHECK(f.be.outstanding_bytes() == 0);
    }
  }
  INFO("yields " << yields << ", held again after one " << yields_seen << " (" << home_again << " at home), grown "
                 << extended << ", waits checked " << waits_checked << ", failures " << failures);
  // Scaled to the run's length (about 20 yields, 4-6 spans held again after one, 1.7 of them at home
  // and 5-9 grown in place every 100 operations, over the six runs). Three seeds, not two, since spans
  // grow apart from pieces: a piece larger than a yielded span now takes its bytes and commits
  // beside them, so fewer spans find their home free (two seeds at 300 operations: 2 homes).
  CHECK(yields > static_cast<std::size_t>(ops) / 15);
  CHECK(yields_seen > static_cast<std::size_t>(ops) / 50);
  CHECK(home_again > static_cast<std::size_t>(ops) / 150);
  CHECK(extended > static_cast<std::size_t>(ops) / 60);
  CHECK(waits_checked > 0);
  CHECK(failures > 0);
}
