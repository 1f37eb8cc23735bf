// REFPOOL_API marks what librefpool exports. The library is built with hidden visibility, so
// only what is marked is part of its ABI; refpool::detail internals are not.
#pragma once

#if defined(__GNUC__)
#define REFPOOL_API __attribute__((visibility("default")))
#else
#define REFPOOL_API
#endif
