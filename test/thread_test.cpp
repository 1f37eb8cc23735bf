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

using namespace refpool;

namespace {

constexpr int thread_count = 8;
constexpr int ops_per_thread = 100000;

// Each live buffer carries its owner's stamp in every word; a buffer handed to two owners at once
// would show another stamp.
struct owned {
  array<std::uint64_t> a;
  std::uint64_t stamp;
  bool intact() const {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a.data()[i] != stamp) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("8 threads x 100k operations on one shared cache: no aliasing, no leak", "[threads][stress]") {
  const backend be = make_host_backend();
  std::atomic<std::uint64_t> corrupted{0};
  std::mutex mailbox_mutex;
  std::vector<owned> mailbox;  // buffers passed between threads
  {
    alloc_cache cache{cache_options{}};
    std::vector<std::thread> threads;
    for (int t = 0; t < thread_count; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) * 7919 + 1);
        std::uint64_t next_stamp = static_cast<std::uint64_t>(t) << 48;
        std::vector<owned> mine;
        auto fresh = [&](std::size_t words) {
          owned o{empty<std::uint64_t>(be, {words}), ++next_stamp};
          std::fill_n(o.a.data(), o.a.size(), o.stamp);
          return o;
        };
        auto drop_one = [&] {
          if (mine.empty()) return;
          const std::size_t i = rng() % mine.size();
          if (!mine[i].intact()) corrupted.fetch_add(1);
          if (rng() % 2 == 0) mine[i].a.unsafe_free();
          mine[i] = std::move(mine.back());
          mine.pop_back();
        };
        for (int op = 0; op < ops_per_thread;) {
          scope s(cache);
          const int body = 1 + static_cast<int>(rng() % 64);
          for (int k = 0; k < body && op < ops_per_thread; ++k, ++op) {
            switch (rng() % 8) {
              case 0: case 1: case 2:
                mine.push_back(fresh(std::size_t{1} << (rng() % 8)));
                break;
              case 3: {  // another shape of the same buffer: same owner, same stamp
                if (mine.empty()) break;
                owned& o = mine[rng() % mine.size()];
                if (o.a.size() % 2 == 0) o.a = o.a.reshape({2, o.a.size() / 2}).reshape({o.a.size()});
                break;
              }
              case 4: {  // hand a buffer to another thread
                if (mine.empty()) break;
                std::lock_guard guard(mailbox_mutex);
                mailbox.push_back(std::move(mine.back()));
                mine.pop_back();
                break;
              }
              case 5: {  // adopt one from another thread
                std::lock_guard guard(mailbox_mutex);
                if (mailbox.empty()) break;
                mine.push_back(std::move(mailbox.back()));
                mailbox.pop_back();
                break;
              }
              default:
                drop_one();
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
    for (owned& o : mailbox)
      if (!o.intact()) corrupted.fetch_add(1);
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
