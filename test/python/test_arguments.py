"""Every public entry of the package that takes a size, a count, a device number or an address refuses
a value its C type cannot hold, before anything reaches C (issue 23 row 10: ctypes wrapped sizes
modulo 2**64, so malloc(be, 2**64 + 4096) returned 4 KiB and set_max_idle_bytes(2**64) set 0).

Each case runs against a cache holding one idle block, a scope and a step: a call that reached C
would change the backend's or the cache's counters (a wrapped size allocates, a wrapped limit
evicts), or this thread's last error (a call C refused)."""
import ctypes

import pytest

import refpool
import refpool._library
import refpool._options
import refpool._types

SIZE_MAX = ctypes.c_size_t(-1).value
INT_MAX = 2**31 - 1

# (bad value, the exceptions it may raise) for a size_t parameter.
BAD_SIZES = [
    pytest.param(-1, ValueError, id="negative"),
    pytest.param(SIZE_MAX + 1, OverflowError, id="2**64"),
    pytest.param(SIZE_MAX + 4097, OverflowError, id="2**64+4096"),
    pytest.param(-(SIZE_MAX + 1), ValueError, id="-2**64"),
    pytest.param(4096.0, TypeError, id="float"),
    pytest.param("4096", TypeError, id="str"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param(None, TypeError, id="None"),
]
# For an int parameter (a device number): its sign is C's to judge.
BAD_INTS = [
    pytest.param(INT_MAX + 1, OverflowError, id="2**31"),
    pytest.param(-INT_MAX - 2, OverflowError, id="-2**31-1"),
    pytest.param(2**64, OverflowError, id="2**64"),
    pytest.param(0.0, TypeError, id="float"),
    pytest.param("0", TypeError, id="str"),
]
# For an address or a stream given as an int.
BAD_ADDRESSES = [
    pytest.param(-1, ValueError, id="negative"),
    pytest.param(2**64, OverflowError, id="2**64"),
    pytest.param(2**64 + 4096, OverflowError, id="2**64+4096"),
    pytest.param(4096.5, TypeError, id="float"),
]


class World:
    """A host backend, a cache with one idle 4 KiB block, a live buffer, and the state they are in."""

    def __init__(self):
        self.backend = refpool.Backend.new_host()
        self.cache = refpool.Cache(from_environment=False)
        with self.cache.scope():
            refpool.malloc(self.backend, 4096).close()  # idle in the cache now
        self.buffer = refpool.malloc(self.backend, (4, 4), 4)

    def state(self):
        return (self.backend.stats(), self.cache.stats(), self.buffer.shape, refpool._library.lib().last_error())

    def close(self):
        self.buffer.close()
        self.cache.close()
        self.backend.close()


@pytest.fixture
def world():
    w = World()
    # A known last error: a call that reached C and failed would replace it.
    with pytest.raises(refpool.InvalidArgumentError):
        refpool.allocator.free(ctypes.addressof(ctypes.c_int()))
    yield w
    w.close()


# entry point -> a call taking the bad value `v`. Every public function and method with a size,
# count or int parameter is here, once per such parameter.
SIZE_ENTRIES = {
    "malloc(nbytes)": lambda w, v: refpool.malloc(w.backend, v),
    "malloc(dims[0])": lambda w, v: refpool.malloc(w.backend, (v,), 4),
    "malloc(dims[1])": lambda w, v: refpool.malloc(w.backend, (4, v), 4),
    "malloc(dtype=item size)": lambda w, v: refpool.malloc(w.backend, (4,), v),
    "malloc(stream=..., dtype=item size)": lambda w, v: refpool.malloc(w.backend, (4,), v, stream=0),
    "Buffer.reshape(dims)": lambda w, v: w.buffer.reshape((v,)),
    "Backend.host_limited(capacity_bytes)": lambda w, v: refpool.Backend.host_limited(v),
    "Cache(max_idle_bytes)": lambda w, v: refpool.Cache(max_idle_bytes=v),
    "Cache(conf=..., max_idle_bytes)": lambda w, v: refpool.Cache("segments:on", max_idle_bytes=v),
    "malloc(cache=..., nbytes)": lambda w, v: refpool.malloc(w.backend, v, cache=w.cache),
    "malloc(alignment)": lambda w, v: refpool.malloc(w.backend, 16, alignment=v),
    "Cache.reclaim(keep_bytes)": lambda w, v: w.cache.reclaim(v),
    "Cache.set_max_idle_bytes": lambda w, v: w.cache.set_max_idle_bytes(v),
    "Cache.scope(uncached_warmup_entries)": lambda w, v: w.cache.scope(uncached_warmup_entries=v).enter(),
    "Cache.step(uncached_warmup_entries)": lambda w, v: w.cache.step(uncached_warmup_entries=v).begin(),
    "allocator.configure(max_idle_bytes)": lambda w, v: refpool.allocator.configure(runtime="host", max_idle_bytes=v),
    "allocator.malloc(nbytes)": lambda w, v: refpool.allocator.malloc(v),
    "allocator.reclaim(keep_bytes)": lambda w, v: refpool.allocator.reclaim(v),
    "allocator.step(uncached_warmup_entries)": lambda w, v: refpool.allocator.step(uncached_warmup_entries=v),
    "allocator.set_device_limit(limit_bytes)": lambda w, v: refpool.allocator.set_device_limit(0, v),
    "allocator.pool_stats(pool)": lambda w, v: refpool.allocator.pool_stats((v, 0)),
    "allocator.memory_map(pool)": lambda w, v: refpool.allocator.memory_map((0, v)),
}
# Cache options given as keywords: an int is checked against the option's C type here.
OPTION_ENTRIES = ("Cache(max_idle_bytes)", "Cache(conf=..., max_idle_bytes)", "allocator.configure(max_idle_bytes)")
INT_ENTRIES = {
    "Backend.cuda(device)": lambda w, v: refpool.Backend.cuda(v),
    "Backend.hip(device)": lambda w, v: refpool.Backend.hip(v),
    "allocator.malloc(device)": lambda w, v: refpool.allocator.malloc(16, device=v),
    "allocator.set_device_limit(device)": lambda w, v: refpool.allocator.set_device_limit(v, 4096),
}
ADDRESS_ENTRIES = {
    "allocator.free(address)": lambda w, v: refpool.allocator.free(v),
    "malloc(stream)": lambda w, v: refpool.malloc(w.backend, 16, stream=v),
        "malloc(cache=..., stream)": lambda w, v: refpool.malloc(w.backend, 16, cache=w.cache, stream=v),
    "Buffer.record_stream(stream)": lambda w, v: w.buffer.record_stream(v),
    "Backend.retire_stream(stream)": lambda w, v: w.backend.retire_stream(v),
    "allocator.malloc(stream)": lambda w, v: refpool.allocator.malloc(16, stream=v),
    "allocator.record_stream(address)": lambda w, v: refpool.allocator.record_stream(v, None),
    "allocator.record_stream(stream)": lambda w, v: refpool.allocator.record_stream(4096, v),
}


def check_refused(world, call, value, expected):
    before = world.state()
    with pytest.raises(expected) as raised:
        call(world, value)
    assert str(raised.value).startswith("refpool: "), raised.value
    assert world.state() == before  # nothing reached C


@pytest.mark.parametrize("value,expected", BAD_SIZES)
@pytest.mark.parametrize("entry", SIZE_ENTRIES)
def test_sizes_outside_size_t_are_refused_before_c(world, entry, value, expected):
    if value is None and entry in (*OPTION_ENTRIES, "Cache.set_max_idle_bytes", "allocator.set_device_limit(limit_bytes)"):
        pytest.skip("None means 'the default' here")
    if isinstance(value, str) and entry in OPTION_ENTRIES:
        pytest.skip("a str is the option's REFPOOL_CONF text, which C judges (test_options.py)")
    if isinstance(value, str) and "dtype" in entry:
        pytest.skip("a str is a typestr (test_buffer.py)")
    check_refused(world, SIZE_ENTRIES[entry], value, expected)


@pytest.mark.parametrize("value,expected", BAD_INTS)
@pytest.mark.parametrize("entry", INT_ENTRIES)
def test_ints_outside_int_are_refused_before_c(world, entry, value, expected):
    check_refused(world, INT_ENTRIES[entry], value, expected)


@pytest.mark.parametrize("value,expected", BAD_ADDRESSES)
@pytest.mark.parametrize("entry", ADDRESS_ENTRIES)
def test_addresses_outside_a_pointer_are_refused_before_c(world, entry, value, expected):
    check_refused(world, ADDRESS_ENTRIES[entry], value, expected)


def test_the_issues_two_cases():
    with refpool.Backend.new_host() as be, refpool.Cache(from_environment=False) as cache:
        with pytest.raises(OverflowError, match=r"shape\[0\] is 18446744073709555712"):
            refpool.malloc(be, 2**64 + 4096)
        assert be.stats()["allocation_count"] == 0
        with cache.scope():
            refpool.malloc(be, 4096).close()
        with pytest.raises(OverflowError, match="max_idle_bytes is 18446744073709551616"):
            cache.set_max_idle_bytes(2**64)
        assert cache.stats()["idle_bytes"] == 4096  # a limit of 0 would have evicted it


def test_the_edges_of_each_type_still_reach_c():
    # The checks refuse only what the C type cannot hold: SIZE_MAX, INT_MAX and INT_MIN get to C,
    # which judges them (a host backend cannot give SIZE_MAX bytes; no device INT_MIN exists).
    with refpool.Backend.new_host() as be, refpool.Cache(from_environment=False) as cache:
        with pytest.raises((refpool.OutOfMemoryError, refpool.SizeError)):
            refpool.malloc(be, SIZE_MAX)
        cache.set_max_idle_bytes(SIZE_MAX)
        assert cache.reclaim(SIZE_MAX) == 0
        for device in (INT_MAX, -INT_MAX - 1):
            with pytest.raises(refpool.RefpoolError):  # C's error: unavailable here, or no such device
                refpool.Backend.cuda(device)
        numpy = pytest.importorskip("numpy")
        with cache.scope():
            refpool.malloc(be, numpy.int64(64), numpy.int64(4)).close()  # int-likes are ints


def test_wrong_arity_is_a_type_error_naming_the_function():
    with pytest.raises(TypeError, match=r"refpool_free\(\) takes 1 positional argument but 2 were given"):
        refpool._library.lib().fn("refpool_free")(None, None)


# ---- text arguments (issue 35 row 8) --------------------------------------------------------------
# C reads text up to its first NUL: "segments:off\0,rounding:step:512" was the conf "segments:off",
# step(plan="\0named") a key-less step, and "k\0a" and "k\0b" one plan key. Each text argument is
# refused with a ValueError naming it, before anything reaches C.
TEXT_ENTRIES = {
    "Cache(conf)": lambda w, v: refpool.Cache(f"segments:off{v},rounding:step:512", from_environment=False),
    "Cache(option)": lambda w, v: refpool.Cache(segments=f"off{v}junk", from_environment=False),
    "Cache.scope(plan)": lambda w, v: w.cache.scope(plan=f"k{v}a"),
    "Cache.step(plan)": lambda w, v: w.cache.step(plan=f"{v}named"),
    "allocator.configure(conf)": lambda w, v: refpool.allocator.configure(runtime="host", conf=f"segments:on{v}"),
    "allocator.configure(option)": lambda w, v: refpool.allocator.configure(runtime="host", rounding=f"exact{v}"),
    "allocator.step(plan)": lambda w, v: refpool.allocator.step(plan=f"k{v}b"),
}
TEXT_NAMES = {"Cache(conf)": "conf", "Cache(option)": "segments", "Cache.scope(plan)": "plan",
              "Cache.step(plan)": "plan", "allocator.configure(conf)": "conf",
              "allocator.configure(option)": "rounding", "allocator.step(plan)": "plan"}


@pytest.mark.parametrize("value", [pytest.param("\x00", id="NUL"), pytest.param("\ud800", id="lone-surrogate")])
@pytest.mark.parametrize("entry", TEXT_ENTRIES)
def test_text_that_c_cannot_read_whole_is_refused_naming_the_argument(world, entry, value):
    before = world.state()
    with pytest.raises(ValueError, match=rf"^refpool: .*\b{TEXT_NAMES[entry]}\b") as raised:
        TEXT_ENTRIES[entry](world, value)
    assert not isinstance(raised.value, refpool.RefpoolError)  # refused here, not by C
    assert world.state() == before


def test_a_plan_key_with_a_nul_is_no_key_and_no_other_key(world):
    # The issue's cases: "\0named" ran as a key-less step; "k\0a" and "k\0b" were one key.
    with pytest.raises(ValueError, match="plan"):
        with world.cache.step(plan="\x00named"):
            pass
    for key in ("k\x00a", "k\x00b"):
        with pytest.raises(ValueError, match="plan"):
            world.cache.scope(plan=key)
    assert world.cache.stats()["steps"] == 0


def test_text_reaching_c_is_checked_at_the_c_call_too():
    # Every char* parameter and struct field, whoever fills it (the framework adapters too).
    library = refpool._library.lib()
    options = refpool._options.struct_type()()
    library.call("refpool_cache_options_init", options)
    with pytest.raises(ValueError, match=r"refpool_cache_options_parse: conf .*NUL"):
        library.call("refpool_cache_options_parse", options, b"segments:off\x00junk")
    with pytest.raises(ValueError, match=r"refpool_cache_options_set: value .*NUL"):
        library.call("refpool_cache_options_set", options, b"segments", b"off\x00")
    with pytest.raises(ValueError, match=r"ScopeOptions.plan .*NUL"):
        refpool._types.ScopeOptions(0, b"k\x00a")


def test_text_without_nul_still_reaches_c(world):
    # Keys are text of any script; C compares their UTF-8 bytes.
    for key in ("k", "ключ", "k a"):
        with world.cache.scope(plan=key):
            refpool.malloc(world.backend, 64).close()
    with pytest.raises(refpool.ConfigError, match="segments"):
        refpool.Cache(segments="sideways", from_environment=False)


# ---- arguments of the wrong kind (issue 38) ----------------------------------------------------------
# Every bad argument is a TypeError or ValueError that names it (malloc(None, ...) was a bare
# AttributeError), raised before anything reaches C.
class Closed:
    """Closed objects of each kind, made once the world exists."""

    def __init__(self, w):
        self.backend = refpool.Backend.new_host()
        self.backend.close()
        self.cache = refpool.Cache(from_environment=False)
        self.cache.close()


WRONG_ARGUMENTS = {
    "malloc(backend=None)": (lambda w, c: refpool.malloc(None, 16), TypeError, "backend"),
    "malloc(backend=cache)": (lambda w, c: refpool.malloc(w.cache, 16), TypeError, "backend"),
    "malloc(backend closed)": (lambda w, c: refpool.malloc(c.backend, 16), ValueError, "backend"),
    "malloc(shape=None)": (lambda w, c: refpool.malloc(w.backend, None), TypeError, "shape"),
    "malloc(shape='16')": (lambda w, c: refpool.malloc(w.backend, "16"), TypeError, "shape"),
    "malloc(shape=(4, 'a'))": (lambda w, c: refpool.malloc(w.backend, (4, "a")), TypeError, r"shape\[1\]"),
    "malloc(dtype=None)": (lambda w, c: refpool.malloc(w.backend, 4, None), TypeError, "dtype"),
    "malloc(dtype='quad')": (lambda w, c: refpool.malloc(w.backend, 4, "quad"), ValueError, "dtype"),
    "malloc(cache=backend)": (lambda w, c: refpool.malloc(w.backend, 4, cache=w.backend), TypeError, "cache"),
    "malloc(cache closed)": (lambda w, c: refpool.malloc(w.backend, 4, cache=c.cache), ValueError, "cache"),
    "malloc(stream='s')": (lambda w, c: refpool.malloc(w.backend, 4, stream="s"), TypeError, "stream"),
    "malloc(alignment=None)": (lambda w, c: refpool.malloc(w.backend, 4, alignment=None), TypeError, "alignment"),
    "Buffer.reshape(None)": (lambda w, c: w.buffer.reshape(None), TypeError, "dims"),
    "Buffer.record_stream(object())": (lambda w, c: w.buffer.record_stream(object()), TypeError, "stream"),
    "Buffer.__dlpack__(dl_device=1)": (lambda w, c: w.buffer.__dlpack__(dl_device=1), TypeError, "dl_device"),
    "Backend.cuda(kind=None)": (lambda w, c: refpool.Backend.cuda(0, kind=None), TypeError, "memory kind"),
    "Backend.cuda(kind='vram')": (lambda w, c: refpool.Backend.cuda(0, kind="vram"), ValueError, "memory kind"),
    "Scope(None)": (lambda w, c: refpool.Scope(None), TypeError, "cache"),
    "Step(closed cache)": (lambda w, c: refpool.Step(c.cache), ValueError, "cache"),
    "Cache.scope(plan=1)": (lambda w, c: w.cache.scope(plan=1), TypeError, "plan"),
    "Cache(conf=b'...')": (lambda w, c: refpool.Cache(b"segments:off"), TypeError, "conf"),
    "Cache(segments=[])": (lambda w, c: refpool.Cache(segments=[]), TypeError, "segments"),
    "StatsRecorder(None)": (lambda w, c: refpool.StatsRecorder(None), TypeError, "cache"),
    "allocator.configure(runtime=0)": (lambda w, c: refpool.allocator.configure(runtime=0), TypeError, "runtime"),
    "allocator.pool_stats(pool=1)": (lambda w, c: refpool.allocator.pool_stats(1), TypeError, "pool"),
    "allocator.memory_map(pool=1)": (lambda w, c: refpool.allocator.memory_map(1), TypeError, "pool"),
    # One number is no pool id: not pool (5, 0) by default.
    "allocator.memory_map(pool=(5,))": (lambda w, c: refpool.allocator.memory_map((5,)), TypeError, "pool"),
}


@pytest.mark.parametrize("entry", WRONG_ARGUMENTS)
def test_a_bad_argument_is_a_type_or_value_error_naming_it(world, entry):
    call, expected, name = WRONG_ARGUMENTS[entry]
    closed = Closed(world)
    before = world.state()
    with pytest.raises(expected, match=rf"^refpool: .*{name}") as raised:
        call(world, closed)
    assert not isinstance(raised.value, refpool.RefpoolError)  # refused here, not by C
    assert world.state() == before


# ---- how the package passes structs and reads text (refpool.h: structs that grow) -------------------
def test_a_struct_parameter_passes_its_address_and_when_sized_its_size():
    calls = []
    parameters = [("options", refpool._checked.SIZED), ("flag", ctypes.c_int), ("info", refpool._checked.BY_ADDRESS)]
    function = refpool._checked.checked_function("refpool_stand_in", lambda *args: calls.append(args), parameters)
    assert refpool._checked.c_types(parameters) == [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    options, info = refpool._types.ScopeOptions(), refpool._types.BufferInfo()
    function(options, 1, info)
    function(None, 0, None)
    (address, size, flag, info_address), null_call = calls
    assert address._obj is options and size == ctypes.sizeof(refpool._types.ScopeOptions) and flag == 1
    assert info_address._obj is info
    assert null_call == (None, 0, 0, None)  # NULL: the size is 0, which C ignores
    with pytest.raises(TypeError, match="refpool_stand_in: options must be a ctypes struct, not dict"):
        function({}, 0, None)


def test_text_is_read_at_its_length_even_while_it_grows():
    # A stand-in with refpool_cache_summary's contract: *length is set on every call; too small a
    # capacity is INVALID_ARGUMENT with nothing written. The text grows once between the calls.
    texts = iter([b"short", b"a longer text", b"a longer text"])
    calls = []

    def summary(cache, detail, text, capacity, length):
        current = next(texts)
        calls.append(capacity)
        length._obj.value = len(current)
        if capacity <= len(current):
            return refpool._types.INVALID_ARGUMENT
        ctypes.memmove(text, current + b"\0", len(current) + 1)
        return refpool._types.OK

    assert refpool._library.read_text(summary, (None, 0), RuntimeError) == "a longer text"
    assert calls == [0, 6, 14]
    with pytest.raises(RuntimeError):  # any other failure is the library's error
        refpool._library.read_text(lambda *args: 9, (None, 0), RuntimeError)


def test_summary():
    library = refpool._library.lib()
    if not library.has("refpool_cache_summary"):
        pytest.skip("this librefpool has no refpool_cache_summary")
    with refpool.Backend.new_host() as be, refpool.Cache(from_environment=False) as cache:
        with cache.scope():
            kept = refpool.malloc(be, 3 << 20)
        short, full = cache.summary(), cache.summary("full")
        assert "MiB" in short and len(full) > len(short)
        with pytest.raises(ValueError, match="detail"):
            cache.summary("long")
        kept.close()


def test_hostile_text_and_dtype_objects(world):
    # Objects that lie about themselves: a str whose encode() hides the NUL, a dtype whose .str is a
    # typestr of Unicode digits.
    class Lying(str):
        def encode(self, *args, **kwargs):
            return b"harmless"
    with pytest.raises(ValueError, match="plan .*NUL"):
        world.cache.step(plan=Lying("k\x00a"))

    class Dtype:
        str = "<f\u0664"
    with pytest.raises(ValueError, match="dtype"):
        refpool.malloc(world.backend, 4, Dtype())
