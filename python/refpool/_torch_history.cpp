// Memory history for refpool as PyTorch's allocator: torch.cuda.memory._record_memory_history()
// with the Python, TorchScript and C++ frames PyTorch's own allocator records, for _snapshot() and
// memory_viz. A library of its own, built at first use against the PyTorch in use (it needs
// torch::CapturedTraceback), so that the hooks work where it cannot be built. While recording is on
// it is the hooks' tracker (_torch_hooks.hpp); off, the hooks call nothing and this holds nothing.
//
// What it keeps, as PyTorch's allocator: a trace of actions (alloc, free_requested, free_completed,
// oom, and segment_free for an empty_cache), up to max_entries, and the frames of each live
// allocation. Frames are gathered outside its mutex: gathering Python frames takes the GIL.
#include <torch/csrc/profiler/combined_traceback.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "_torch_hooks.hpp"

namespace {

using traceback = std::shared_ptr<torch::CapturedTraceback>;

// The actions this records, in the bit order of refpool/_torch_history.py's ACTIONS.
enum action { alloc_action, free_requested, free_completed, oom_action, segment_free, actions };
const char* const action_names[actions] = {"alloc", "free_requested", "free_completed", "oom", "segment_free"};

// PyTorch's RecordContext: when frames are gathered.
enum record_when { when_never, when_state, when_alloc, when_all };

struct settings {
  int when = when_never;
  bool cpp = false;
  std::size_t max_entries = 1;
  unsigned skip = 0;  // bit per action
};

struct entry {
  int action;
  std::uintptr_t addr;  // device_free for oom
  std::size_t size;
  int device;
  std::uintptr_t stream;
  std::int64_t time_us;
  traceback frames;
  std::string user_metadata;
};

struct live_block {
  std::size_t size;
  int device;
  std::uintptr_t stream;
  refpool_torch::pool_name pool;
  traceback frames;
  bool pending_free = false;  // freed, waiting for record_stream's streams (free_completed ends it)
  traceback free_frames;      // the free's, for its free_completed
};

struct history {
  std::mutex mutex;  // guards everything below
  settings recording;
  std::deque<entry> trace;
  std::unordered_map<std::uintptr_t, live_block> live;
  std::string user_metadata;
};

// Leaked: PyTorch frees tensors from static destructors, after this library's own would have run.
history& state() {
  static auto* made = new history;
  return *made;
}

settings current_settings() {
  history& h = state();
  std::lock_guard lock(h.mutex);
  return h.recording;
}

traceback gather(bool wanted, bool cpp) { return wanted ? torch::CapturedTraceback::gather(true, true, cpp) : nullptr; }

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Under h.mutex.
void record(history& h, const settings& s, int what, std::uintptr_t addr, std::size_t size, int device,
            std::uintptr_t stream, traceback frames) {
  if ((s.skip >> what) & 1U) return;
  h.trace.push_back(entry{what, addr, size, device, stream, now_us(), std::move(frames), h.user_metadata});
  while (h.trace.size() > s.max_entries) h.trace.pop_front();
}

void on_alloc(void* ptr, std::size_t size, int device, void* stream, refpool_torch::pool_name pool) {
  const settings s = current_settings();
  traceback frames = gather(s.when >= when_state, s.cpp);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const auto on = reinterpret_cast<std::uintptr_t>(stream);
  try {
    history& h = state();
    std::lock_guard lock(h.mutex);
    h.live[addr] = live_block{size, device, on, pool, frames};
    record(h, s, alloc_action, addr, size, device, on, s.when >= when_alloc ? frames : nullptr);
  } catch (const std::exception&) {  // out of host memory: the allocation stands, unrecorded
  }
}

// A free: the block stays live, pending, until on_free_completed (at once, or when a free that
// record_stream deferred completes).
void on_free_requested(void* ptr, std::size_t size, int device, void* stream) {
  const settings s = current_settings();
  traceback frames = gather(s.when >= when_all, s.cpp);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const auto on = reinterpret_cast<std::uintptr_t>(stream);
  try {
    history& h = state();
    std::lock_guard lock(h.mutex);
    if (const auto it = h.live.find(addr); it != h.live.end()) {
      it->second.pending_free = true;
      it->second.free_frames = frames;
    }
    record(h, s, free_requested, addr, size, device, on, std::move(frames));
  } catch (const std::exception&) {}
}

// With the free's frames, gathering none: a deferred free completes while the hooks give pending
// frees back, which a thread holding the GIL may be waiting for.
void on_free_completed(void* ptr, std::size_t size, int device) {
  const settings s = current_settings();
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  try {
    history& h = state();
    std::lock_guard lock(h.mutex);
    const auto it = h.live.find(addr);
    if (it == h.live.end()) {  // allocated before recording began
      record(h, s, free_completed, addr, size, device, 0, nullptr);
      return;
    }
    const live_block b = std::move(it->second);
    h.live.erase(it);
    record(h, s, free_completed, addr, b.size, b.device, b.stream, b.free_frames);
  } catch (const std::exception&) {}
}

void on_oom(std::size_t size, int device, std::size_t device_free) {
  const settings s = current_settings();
  traceback frames = gather(s.when >= when_alloc, s.cpp);
  try {
    history& h = state();
    std::lock_guard lock(h.mutex);
    record(h, s, oom_action, device_free, size, device, 0, std::move(frames));
  } catch (const std::exception&) {}
}

// empty_cache gives idle memory back to the driver; refpool's segments are not PyTorch's, so this
// is one segment_free of no address and size, with the caller's frames.
void on_empty_cache() {
  const settings s = current_settings();
  traceback frames = gather(s.when >= when_all, s.cpp);
  try {
    history& h = state();
    std::lock_guard lock(h.mutex);
    record(h, s, segment_free, 0, 0, 0, 0, std::move(frames));
  } catch (const std::exception&) {}
}

const refpool_torch::tracker history_tracker{on_alloc, on_free_requested, on_free_completed, on_oom, on_empty_cache};

// ---- the dump: JSON, built outside the mutex (symbolizing Python frames takes the GIL) ----------

void append_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
      out += escaped;
    } else {
      out += c;  // UTF-8 passes through
    }
  }
  out += '"';
}

// The frames of traceback `index` of `symbols` (SIZE_MAX: none) as a JSON list.
void append_frames(std::string& out, const torch::SymbolizedTracebacks& symbols, std::size_t index) {
  out += '[';
  if (index == SIZE_MAX) {
    out += ']';
    return;
  }
  bool first = true;
  for (const std::uint64_t f : symbols.tracebacks[index]) {
    const auto& frame = symbols.all_frames[f];
    if (!first) out += ',';
    first = false;
    out += "{\"filename\":";
    append_string(out, frame.filename);
    out += ",\"name\":";
    append_string(out, frame.funcname);
    out += ",\"line\":" + std::to_string(frame.lineno) + "}";
  }
  out += ']';
}

}  // namespace

extern "C" {

/// The tracker to give the hooks (refpool_torch_hooks_set_tracker) while recording.
const void* refpool_torch_history_tracker() { return &history_tracker; }

/// Sets what is recorded (_record_memory_history's arguments, parsed by Python): `when` 0-3 as
/// PyTorch's RecordContext (never, state, alloc, all), C++ frames too, the trace's length, the
/// actions to skip (bits), and whether to clear what was recorded.
void refpool_torch_history_configure(int when, int cpp, std::size_t max_entries, unsigned skip, int clear) {
  history& h = state();
  std::lock_guard lock(h.mutex);
  h.recording = settings{when, cpp != 0, max_entries == 0 ? 1 : max_entries, skip};
  if (clear != 0) {
    h.trace.clear();
    h.live.clear();
  }
  while (h.trace.size() > h.recording.max_entries) h.trace.pop_front();
}

/// torch.cuda.memory._set_memory_metadata: attached to the actions recorded from now on.
void refpool_torch_history_set_metadata(const char* text) {
  history& h = state();
  std::lock_guard lock(h.mutex);
  h.user_metadata = text == nullptr ? "" : text;
}

/// What is recorded, as JSON: {"trace": [...], "live": [...]} with symbolized frames. The caller
/// frees it with refpool_torch_history_free. NULL if out of memory or symbolizing failed.
char* refpool_torch_history_dump() {
  std::vector<entry> entries;
  std::vector<std::pair<std::uintptr_t, live_block>> blocks;
  {
    history& h = state();
    std::lock_guard lock(h.mutex);
    entries.assign(h.trace.begin(), h.trace.end());
    blocks.assign(h.live.begin(), h.live.end());
  }
  try {
    std::vector<torch::CapturedTraceback*> to_symbolize;
    std::vector<std::size_t> entry_index(entries.size(), SIZE_MAX);
    std::vector<std::size_t> block_index(blocks.size(), SIZE_MAX);
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i].frames) entry_index[i] = to_symbolize.size(), to_symbolize.push_back(entries[i].frames.get());
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (blocks[i].second.frames)
        block_index[i] = to_symbolize.size(), to_symbolize.push_back(blocks[i].second.frames.get());
    const torch::SymbolizedTracebacks symbols = torch::symbolize(to_symbolize);

    std::string out = "{\"trace\":[";
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const entry& e = entries[i];
      if (i != 0) out += ',';
      out += "{\"action\":\"";
      out += action_names[e.action];
      out += e.action == oom_action ? "\",\"device_free\":" : "\",\"addr\":";
      out += std::to_string(e.addr) + ",\"size\":" + std::to_string(e.size) +
             ",\"device\":" + std::to_string(e.device) + ",\"stream\":" + std::to_string(e.stream) +
             ",\"time_us\":" + std::to_string(e.time_us) + ",\"user_metadata\":";
      append_string(out, e.user_metadata);
      out += ",\"frames\":";
      append_frames(out, symbols, entry_index[i]);
      out += '}';
    }
    out += "],\"live\":[";
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto& [addr, b] = blocks[i];
      if (i != 0) out += ',';
      out += "{\"addr\":" + std::to_string(addr) + ",\"size\":" + std::to_string(b.size) +
             ",\"device\":" + std::to_string(b.device) + ",\"stream\":" + std::to_string(b.stream) + ",\"pool\":[" +
             std::to_string(b.pool.first) + "," + std::to_string(b.pool.second) +
             "],\"pending_free\":" + (b.pending_free ? "true" : "false") + ",\"frames\":";
      append_frames(out, symbols, block_index[i]);
      out += '}';
    }
    out += "]}";
    char* copy = static_cast<char*>(std::malloc(out.size() + 1));
    if (copy != nullptr) std::memcpy(copy, out.c_str(), out.size() + 1);
    return copy;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "refpool: the memory history could not be read: %s\n", e.what());
    return nullptr;
  }
}

/// Frees what refpool_torch_history_dump returned.
void refpool_torch_history_free(char* dump) { std::free(dump); }

}  // extern "C"
