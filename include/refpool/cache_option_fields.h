/* refpool/cache_option_fields.h: every option of a cache, defined once. C and C++.
 *
 * REFPOOL_CACHE_OPTIONS(X) expands X(kind, name, default_text, description) for each option, in a
 * fixed order. It makes the fields of refpool::cache_options and of the C struct
 * refpool_cache_options, the cache keys of REFPOOL_CONF and of conf strings, and the rows of
 * refpool_cache_option_info, from which the Python package builds its struct and keywords.
 *
 * `kind` says how the value is typed and spelled:
 *   kind              text (REFPOOL_CONF, conf strings, Python)   C type                    C++ type
 *   rounding_policy   exact, step:<bytes>, pow2, pow2:<divisions>  refpool_rounding_policy   refpool::rounding_policy
 *   byte_limit        <bytes>[K|M|G|T], unlimited                  refpool_byte_limit        std::size_t
 *   segment_policy    off, on, auto                                refpool_segment_policy    refpool::segment_policy
 *   on_off            on, off                                      refpool_on_off            bool
 * on and off are also read from true/false, yes/no and 1/0, in any case (one spelling is documented:
 * on/off). `default_text` is the default, spelled that way. A new option of one of these kinds is one line
 * here (docs/design.md, "Configuration"); a new kind also needs its C type in refpool.h, its tag
 * and parse_option in refpool/cache_options.hpp, its conversions in lib/config/option_kinds.cpp
 * and its ctypes type in python/refpool/_options.py. The C struct must not end in padding (a
 * static_assert in lib/c_api/cache_options_c.cpp says so): an option of a 4-byte C type that would
 * leave some comes with an explicit padding field, so every layout has a size of its own. */
#ifndef REFPOOL_CACHE_OPTION_FIELDS_H
#define REFPOOL_CACHE_OPTION_FIELDS_H

#define REFPOOL_CACHE_OPTIONS(X)                                                                       \
  X(rounding_policy, rounding, "exact", "how request sizes become block sizes (and so cache keys)")    \
  X(byte_limit, max_idle_bytes, "unlimited",                                                           \
    "when idle bytes exceed this, least recently released idle blocks are freed to the backend")       \
  X(segment_policy, segments, "auto",                                                                  \
    "serve misses by carving pieces out of segments (on), by one backend allocation per block (off), " \
    "or on for device memory with virtual memory and off for the rest (auto)")                         \
  X(on_off, auto_plans, "on",                                                                         \
    "a step opened without a plan key plans under the cache's own key: request sequences that "      \
    "repeat are recognised by their content and replayed from packed arenas")                         \
  /* New options go above this line: each row ends with a backslash, so adding one adds one line. */

#endif
