"""Cache options from Python: the package takes them from the library's table (refpool_cache_option_info),
so every option the library has is a keyword of Cache, allocator.configure and the framework installs,
spelled as in REFPOOL_CONF and in a `conf` string. The tests walk the table: an option added to the
library is covered here without a change."""
import ctypes
import inspect

import pytest

import refpool
import refpool.cupy
import refpool.numba
import refpool.torch
from refpool import _options
from conftest import run_python

# A value other than the default, for each kind of option.
OTHER_VALUE = {"rounding_policy": "step:512", "byte_limit": "3M", "segment_policy": "off", "on_off": "off"}


def field_values(struct):
    """The fields of a ctypes struct as plain values (nested structs as dicts), padding left out."""
    values = {}
    for name, _ in struct._fields_:
        value = getattr(struct, name)
        values[name] = field_values(value) if isinstance(value, ctypes.Structure) else value
    return values


def filled(conf=None, **options):
    return field_values(_options.cache_options(conf, options, from_environment=False))


def test_the_table_is_the_library_s():
    table = _options.table()
    assert list(table) == list(refpool.cache_option_descriptions())
    assert {"rounding", "max_idle_bytes", "segments"} <= set(table)
    for option in table.values():
        assert option.kind in OTHER_VALUE, option
        assert option.allowed and option.description


def test_each_default_is_text_the_library_reads_back_to_the_default():
    defaults = filled()
    for name, option in _options.table().items():
        assert filled(**{name: option.default}) == defaults, name
        assert filled(f"{name}:{option.default}") == defaults, name


@pytest.mark.parametrize("name", list(_options.table()))
def test_keyword_conf_and_refpool_conf_spell_an_option_the_same_way(name):
    text = OTHER_VALUE[_options.table()[name].kind]
    by_keyword = filled(**{name: text})
    assert by_keyword != filled(), f"{name}={text!r} changed nothing"
    assert filled(f"{name}:{text}") == by_keyword
    from_environment = run_python("""
        from refpool import _options
        print(bytes(_options.cache_options()).hex())
    """, env={"REFPOOL_CONF": f"{name}:{text}"})
    struct = _options.struct_type().from_buffer_copy(bytes.fromhex(from_environment.stdout.split()[-1]))
    assert field_values(struct) == by_keyword


def test_keywords_win_over_conf_and_conf_over_refpool_conf():
    result = run_python("""
        import ctypes
        from refpool import _options
        options = _options.cache_options("segments:on,max_idle_bytes:2K", {"segments": "off"})
        print(options.rounding.parameter, options.max_idle_bytes, options.segments)
    """, env={"REFPOOL_CONF": "rounding:step:64,max_idle_bytes:1K,segments:auto"})
    assert result.stdout.split() == ["64", "2048", "1"]  # REFPOOL_SEGMENTS_OFF is 1


def test_an_int_is_checked_against_the_option_s_c_type():
    assert filled(max_idle_bytes=4096) == filled(max_idle_bytes="4K")
    with pytest.raises(OverflowError, match=r"refpool.Cache: max_idle_bytes is 18446744073709551616"):
        refpool.Cache(max_idle_bytes=2**64)
    with pytest.raises(ValueError, match="cannot be negative"):
        refpool.Cache(max_idle_bytes=-1)
    with pytest.raises(TypeError, match=r"rounding must be a str \(exact, step:<bytes>"):
        refpool.Cache(rounding=512)
    with pytest.raises(TypeError, match="max_idle_bytes must be a str or an int"):
        refpool.Cache(max_idle_bytes=1.5)


def test_bad_options_name_the_option_and_its_allowed_values():
    with pytest.raises(TypeError, match="unknown option 'rounding_parameter'; cache options: rounding, "):
        refpool.Cache(rounding="step", rounding_parameter=512)
    with pytest.raises(refpool.ConfigError, match="'rounding' has value 'step'; allowed: exact, step:<bytes>"):
        refpool.Cache(rounding="step")
    with pytest.raises(refpool.ConfigError, match="'max_idle_bytes' has value 'lots'; allowed: a byte count"):
        refpool.Cache("max_idle_bytes:lots")
    with pytest.raises(refpool.ConfigError, match="'log' is process-wide: set it in REFPOOL_CONF"):
        refpool.Cache("log:/tmp/refpool.csv")
    with pytest.raises(refpool.ConfigError, match="entry 'segments' is not key:value"):
        refpool.Cache("segments")
    with pytest.raises(TypeError, match="conf must be a str"):
        refpool.Cache({"segments": "off"})
    with pytest.raises(TypeError, match=r"refpool.allocator.configure\(\) got an unknown option 'colour'"):
        refpool.allocator.configure(runtime="host", colour="blue")


def test_a_conf_string_configures_the_allocator():
    result = run_python("""
        import refpool
        refpool.allocator.configure(runtime="host", conf="rounding:step:4096,max_idle_bytes:1M")
        refpool.allocator.free(refpool.allocator.malloc(100))
        print(refpool.allocator.stats()["idle_bytes"])
    """)
    assert result.stdout.split() == ["4096"]


def test_every_install_takes_conf_and_the_option_keywords():
    for install in (refpool.allocator.configure, refpool.torch.install, refpool.cupy.install, refpool.numba.install):
        parameters = inspect.signature(install).parameters
        assert "conf" in parameters, install
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()), install


def test_an_install_checks_its_options_before_configuring():
    # configure_if_given is what every adapter's install() calls: no options, no configuration (the
    # allocator stays configurable); a bad one fails before anything is set.
    result = run_python("""
        import refpool
        from refpool import allocator
        allocator.configure_if_given("cuda", "device", None, {}, "test.install")
        try:
            allocator.configure_if_given("cuda", "device", None, {"max_idle_bytes": -1}, "test.install")
        except ValueError as e:
            print("refused:", e)
        allocator.configure(runtime="host", segments="on")  # still configurable
        allocator.configure_if_given("host", "device", None, {"rounding": "step:512"}, "test.install")
        allocator.free(allocator.malloc(100))
        print(allocator.stats()["idle_bytes"], allocator.stats()["segments"])
    """)
    lines = result.stdout.splitlines()
    assert lines[0] == "refused: refpool: test.install: max_idle_bytes is -1; it cannot be negative"
    assert lines[1].split() == ["512", "0"]  # the later configure replaced segments:on


def test_switches_take_python_booleans():
    # Issue 38: refpool.Cache(auto_plans=False) was a TypeError. True and False spell "on" and "off"
    # for every option whose values include them; elsewhere a bool is refused naming the option.
    switches = [name for name, option in _options.table().items() if option.kind in ("on_off", "segment_policy")]
    assert {"auto_plans", "segments"} <= set(switches)
    for name in switches:
        assert filled(**{name: False}) == filled(**{name: "off"}), name
        assert filled(**{name: True}) == filled(**{name: "on"}), name
    backend = refpool.Backend.new_host()
    for auto_plans in (True, False):
        with refpool.Cache(auto_plans=auto_plans, from_environment=False) as cache:
            for _ in range(4):
                with cache.step():  # planned under the cache's own key only with auto_plans on
                    refpool.malloc(backend, 4096, cache=cache).close()
            assert (cache.stats()["plans"] == 1) == auto_plans
    backend.close()
    for name, value in (("max_idle_bytes", True), ("rounding", False), ("auto_plans", 1), ("segments", 0)):
        with pytest.raises(TypeError, match=rf"refpool.Cache: {name} must be .*not (bool|int)"):
            refpool.Cache(**{name: value})
