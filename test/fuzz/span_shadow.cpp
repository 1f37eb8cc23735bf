// The fuzz harness's property-checked heap with spans (span_shadow.hpp).
#include "span_shadow.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "model.hpp"  // fail()

namespace rp = refpool;
using rp::detail::segment_heap;
using rp::detail::segment_span;
using rp::detail::stream_set;

namespace refpool::test::fuzz {

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
/// The span heap's memory: small enough that spans and pieces compete for it.
constexpr std::size_t capacity = 48 * MiB;
constexpr std::size_t sizes[] = {512, 4 * KiB, 100 * KiB, MiB, MiB + 1, 3 * MiB, 6 * MiB, 10 * MiB};
/// One stamp word every `stride` bytes (each is a page the host must fault in).
std::size_t stride_for(std::size_t bytes) { return bytes <= 64 * KiB ? 4 * KiB : MiB; }

struct span_totals {
  std::uint64_t operations = 0, spans = 0, yields = 0, held_at_home = 0, moved = 0, extended = 0, failures = 0;
} totals;

rp::stream_ref stream_of(std::uint64_t h) {
  return {h % 4 == 0 ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(h % 4) << 12)};
}

segment_heap::piece span_bytes(const segment_span& s) { return {s.address(), s.bytes, 0, s.node}; }

}  // namespace

span_shadow::span_shadow(std::uint64_t seed)
    : seed_(seed),
      failing_(std::make_shared<rp::failing_resource>(
          std::make_shared<rp::limiting_resource>(rp::make_host_resource(), capacity))),
      be_(failing_) {
  rp::detail::segment_heap_options o;
  o.use_virtual_memory = seed % 3 != 0;  // one input in three: backend allocations
  o.reserve_bytes = 64 * MiB;            // pools fill their reservation and reserve more
  heap_ = std::make_unique<segment_heap>(be_, o);
}

span_shadow::~span_shadow() {
  // An input that failed part way: give everything back quietly, so the next one starts clean.
  failing_->disarm();
  for (owned& o : owned_) {
    if (o.span != nullptr) heap_->give_back_span(o.span, {});
    if (o.piece.node != nullptr) heap_->give_back(o.piece, {});
    o = owned{};
  }
}

segment_heap::piece span_shadow::bytes_of(const owned& o) const {
  return o.span != nullptr ? span_bytes(*o.span) : o.piece;
}

void span_shadow::write_stamp(const owned& o) const {
  const segment_heap::piece p = bytes_of(o);
  auto* bytes = static_cast<unsigned char*>(p.address);
  for (std::size_t off = 0; off + 8 <= p.bytes; off += stride_for(p.bytes)) {
    const std::uint64_t v = o.stamp + off;
    std::memcpy(bytes + off, &v, sizeof v);
  }
}

void span_shadow::verify(const owned& o, const char* when) const {
  if (o.holding && o.span->now != segment_span::state::held)
    fail(fmt::format("spans: span {} was taken from its owner, who holds it ({})", o.span->id, when));
  if (o.span != nullptr && !o.span->placed()) return;  // yielded: its bytes are the heap's
  const segment_heap::piece p = bytes_of(o);
  const auto* bytes = static_cast<const unsigned char*>(p.address);
  for (std::size_t off = 0; off + 8 <= p.bytes; off += stride_for(p.bytes)) {
    std::uint64_t v = 0;
    std::memcpy(&v, bytes + off, sizeof v);
    if (v != o.stamp + off)
      fail(fmt::format("spans: the {} at {} ({} B) lost its owner's stamp at offset {} ({})",
                       o.span != nullptr ? "span" : "piece", p.address, p.bytes, off, when));
  }
}

void span_shadow::drop(owned& o) {
  verify(o, "before it was given back");
  if (o.span != nullptr) heap_->give_back_span(o.span, stream_set(stream_of(o.stamp)));
  if (o.piece.node != nullptr) heap_->give_back(o.piece, stream_set(stream_of(o.stamp)));
  o = owned{};
}

void span_shadow::step(std::size_t op, std::uint64_t n) {
  const std::uint64_t h = mix(seed_ * 0x9E3779B1ull ^ n ^ 0x5A5Aull);
  if (h % 8 != 0) return;  // one operation in eight: the cache's checks keep most of the time
  owned& o = owned_[h % places];
  const std::size_t bytes = sizes[(h >> 8) % std::size(sizes)];
  const rp::stream_ref s = stream_of(h >> 16);
  const auto fresh = [&] { return (mix(seed_ ^ ++next_stamp_) & ~std::uint64_t{0xFFFFFFF}) | 1; };
  try {
    switch ((op + (h >> 24)) % 12) {
      case 0:
      case 1:
      case 2:  // a piece
        drop(o);
        if (auto c = heap_->carve(bytes, s)) {
          o.piece = c->p;
          o.stamp = fresh();
          write_stamp(o);
        }
        break;
      case 3: drop(o); break;
      case 4:  // a span
        drop(o);
        if (auto c = heap_->carve_span(bytes, s)) {
          o.span = c->span;
          o.holding = true;
          o.stamp = fresh();
          write_stamp(o);
          ++totals.spans;
        }
        break;
      case 5:
        if (o.span != nullptr && o.span->now == segment_span::state::held) {
          verify(o, "when it went idle");
          heap_->idle_span(*o.span, stream_set(s));
          o.holding = false;
        }
        break;
      case 6:
      case 7:
        if (o.span != nullptr && o.span->now != segment_span::state::held) {
          const bool yielded = !o.span->placed();
          const std::uintptr_t home = o.span->home;
          const auto held = heap_->hold_span(*o.span, s);
          o.holding = held.has_value();
          if (held && yielded) {
            if (!held->moved && o.span->home != home) fail("spans: a span held again at home has another address");
            ++(held->moved ? totals.moved : totals.held_at_home);
            o.stamp = fresh();  // its bytes were the heap's meanwhile
            write_stamp(o);
          }
          if (!held && o.span->placed()) fail("spans: hold_span failed, yet the span is placed");
        }
        break;
      case 8:
        if (o.span != nullptr && o.span->now == segment_span::state::held) {
          verify(o, "before it grew");
          if (heap_->extend_span(*o.span, o.span->bytes + bytes, s)) {
            ++totals.extended;
            write_stamp(o);
          }
        }
        break;
      case 9: heap_->trim((h >> 32) % 2 == 0 ? 0 : (h >> 33) % (16 * MiB)); break;
      case 10: heap_->yield_idle_spans(); break;
      default:
        failing_->arm(1 + (h >> 32) % 3, 1,
                      (h >> 40) % 3 == 0 ? rp::failing_resource::failure::backend_error
                                         : rp::failing_resource::failure::out_of_memory);
        break;
    }
  } catch (const rp::backend_error& e) {
    if (e.native_code() != -1) fail(fmt::format("spans: a backend error that was not injected: {}", e.what()));
    ++totals.failures;
  }
  ++totals.operations;
  check(totals.operations % 4 == 0);
}

void span_shadow::check(bool stamps) {
  try {
    heap_->check();
  } catch (const std::logic_error& e) {
    fail(fmt::format("spans: {}", e.what()));
  }
  std::map<std::uintptr_t, std::size_t> out;
  std::size_t pieces = 0, spanned = 0;
  for (const owned& o : owned_) {
    if (o.span == nullptr && o.piece.node == nullptr) continue;
    if (stamps) verify(o, "after an operation");
    if (o.span != nullptr && !o.span->placed()) continue;
    const segment_heap::piece p = bytes_of(o);
    out[reinterpret_cast<std::uintptr_t>(p.address)] = p.bytes;
    (o.span != nullptr ? spanned : pieces) += p.bytes;
  }
  std::uintptr_t end = 0;
  for (const auto& [at, n] : out) {
    if (at < end) fail(fmt::format("spans: two pieces or spans overlap at {:#x}", at));
    end = at + n;
  }
  std::map<std::uintptr_t, std::size_t> in_use;
  for (const auto& r : heap_->ranges())
    if (!r.free) in_use[r.address] = r.bytes;
  if (in_use != out) fail("spans: the heap's ranges in use are not the pieces and spans placed");
  const auto st = heap_->stats();
  if (st.used_bytes != pieces || st.span_bytes != spanned ||
      st.used_bytes + st.span_bytes + st.free_bytes != st.committed_bytes ||
      st.committed_bytes != be_.outstanding_bytes())
    fail(fmt::format("spans: pieces {} B (model {} B), spans {} B (model {} B), free {} B, committed {} B, the "
                     "backend holds {} B",
                     st.used_bytes, pieces, st.span_bytes, spanned, st.free_bytes, st.committed_bytes,
                     be_.outstanding_bytes()));
}

void span_shadow::finish() {
  failing_->disarm();
  totals.yields += heap_->stats().events.span_yields;
  for (owned& o : owned_) drop(o);
  check(true);
  heap_->free_all();
  if (be_.outstanding_bytes() != 0)
    fail(fmt::format("spans: leak: the backend has {} B out after everything went back", be_.outstanding_bytes()));
}

std::string missing_span_coverage() {
  std::string missing;
  if (totals.yields == 0) missing += " no span was yielded;";
  if (totals.held_at_home == 0) missing += " no yielded span was held again at home;";
  if (totals.moved == 0) missing += " no yielded span moved;";
  if (totals.extended == 0) missing += " no span grew in place;";
  return missing;
}

void print_span_totals() {
  fmt::print(stderr,
             "refpool fuzz, heap with spans: {} operations; {} spans made, {} yields, held again {} times at home and "
             "{} elsewhere, grown in place {} times, {} failures\n",
             totals.operations, totals.spans, totals.yields, totals.held_at_home, totals.moved, totals.extended,
             totals.failures);
}

}  // namespace refpool::test::fuzz
