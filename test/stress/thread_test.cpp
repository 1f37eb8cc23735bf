// Many threads, one cache: each thread runs its own scopes, hands some buffers to other threads
// (released there), and checks that no buffer is ever held by two owners at once.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/stamped.hpp"

using namespace refpool;
using refpool::test::stamped_set;

namespace {

constexpr int thread_count = 8;
constexpr int ops_per_thread = 100000;

}  // namespace

TEST_CASE("8 threads x 100k operations on one shared cache: no aliasing, no leak", "[threads][stress]") {
  const backend be = make_host_backend();
  std::atomic<std::uint64_t> corrupted{0};
  std::mutex mailbox_mutex;
  stamped_set mailbox;  // buffers passed between threads, with their owners' stamps
  {
    alloc_cache cache{cache_options{}};
    std::vector<std::thread> threads;
    for (int t = 0; t < thread_count; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
        stamped_set mine;
        auto drop_one = [&] {
          if (mine.empty()) return;
          const std::size_t i = rng() % mine.size();
          const bool early = rng() % 2 == 0;
          if (!mine.drop(i, early)) corrupted.fetch_add(1);
        };
        for (int op = 0; op < ops_per_thread;) {
          scope s(cache);
          const int body = 1 + static_cast<int>(rng() % 64);
          for (int k = 0; k < body && op < ops_per_thread; ++k, ++op) {
            switch (rng() % 8) {
              case 0:
              case 1:
              case 2: mine.add(empty<std::uint64_t>(be, {std::size_t{1} << (rng() % 8)})); break;
              case 3: {  // another shape of the same buffer: same owner, same stamp
                if (mine.empty()) break;
                auto& o = mine[rng() % mine.size()];
                if (o.a.size() % 2 == 0) o.a = o.a.reshape({2, o.a.size() / 2}).reshape({o.a.size()});
                break;
              }
              case 4: {  // hand a buffer to another thread
                if (mine.empty()) break;
                std::lock_guard guard(mailbox_mutex);
                mailbox.adopt(mine.take(mine.size() - 1));
                break;
              }
              case 5: {  // adopt one from another thread
                std::lock_guard guard(mailbox_mutex);
                if (mailbox.empty()) break;
                mine.adopt(mailbox.take(mailbox.size() - 1));
                break;
              }
              default: drop_one();
            }
            if (mine.size() > 32) drop_one();
          }
          if (rng() % 4 == 0) {  // some buffers escape the scope, most do not
            while (mine.size() > 4) drop_one();
          } else {
            while (!mine.empty()) drop_one();
          }
        }
        while (!mine.empty()) drop_one();
      });
    }
    for (auto& t : threads) t.join();
    CHECK(mailbox.damage() == "");
    mailbox.clear();
    const auto st = cache.stats();
    CHECK(st.live_blocks == 0);
    CHECK(st.held_bytes == be.outstanding_bytes());
    CHECK(st.held_bytes == st.idle_bytes);
    CHECK(st.hits > st.misses);
  }
  CHECK(corrupted.load() == 0);
  CHECK(be.outstanding_bytes() == 0);
}
