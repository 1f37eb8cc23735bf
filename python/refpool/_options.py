"""Cache options, driven by the library's own table (refpool_cache_option_info, expanded in C from
include/refpool/cache_option_fields.h): the ctypes struct refpool_cache_options, the keywords that
Cache, allocator.configure and the framework installs take, and their checks. An option the library
adds appears here with no change to this package (a new *kind* of option needs KIND_CTYPES below).

One spelling: a keyword's value is REFPOOL_CONF's text for the option (rounding="pow2:4",
max_idle_bytes="512M", segments="off"), and `conf` takes a whole REFPOOL_CONF-style string of cache
options ("rounding:pow2:4,segments:off"). Byte counts also take an int, checked against their C
type before anything reaches C (_checked); switches (auto_plans, segments) take True and False for
"on" and "off"."""
import ctypes
import functools
from collections import namedtuple
from ctypes import Structure, c_int, c_size_t

from . import _checked
from . import _types as t
from ._library import lib
from .errors import LibraryError


class RoundingPolicy(Structure):
    """refpool_rounding_policy."""
    _fields_ = [("mode", c_int), ("parameter", c_size_t)]


# refpool_option_info.kind -> the ctypes type of the kind's C type (refpool.h; C enums are ints).
KIND_CTYPES = {"rounding_policy": RoundingPolicy, "byte_limit": c_size_t, "segment_policy": c_int, "on_off": c_int}

Option = namedtuple("Option", "name kind ctype offset size default allowed description")


@functools.lru_cache(maxsize=None)
def table():
    """name -> Option, in the library's order (the fields of refpool_cache_options)."""
    library = lib()
    options = {}
    for index in range(library.fn("refpool_cache_option_count")()):
        info = t.OptionInfo()
        library.call("refpool_cache_option_info", index, info)
        name, kind = info.name.decode(), info.kind.decode()
        ctype = KIND_CTYPES.get(kind)
        if ctype is None:
            raise LibraryError(f"refpool: librefpool's cache option {name} is of kind {kind}, which this package "
                               "does not know: it was built from a newer refpool; rebuild both from one source")
        options[name] = Option(name, kind, ctype, info.offset, info.size, info.default_text.decode(),
                               info.allowed.decode(), info.description.decode())
    return options


@functools.lru_cache(maxsize=None)
def struct_type():
    """refpool_cache_options as a ctypes struct, laid out from the table and checked against it."""
    options = table().values()
    struct = type("CacheOptions", (Structure,), {"_fields_": [(o.name, o.ctype) for o in options]})
    for o in options:
        if getattr(struct, o.name).offset != o.offset or ctypes.sizeof(o.ctype) != o.size:
            raise LibraryError(f"refpool: refpool_cache_options.{o.name} is at offset {o.offset}, {o.size} bytes, "
                               "in librefpool but not here: rebuild the library and the package from one source")
    return struct


def descriptions():
    """name -> {"default", "allowed", "description"} of each cache option, from the library."""
    return {o.name: {"default": o.default, "allowed": o.allowed, "description": o.description}
            for o in table().values()}


# Kinds whose values include on and off: True and False spell those.
_SWITCH_KINDS = ("on_off", "segment_policy")


def _text(option, value, what):
    if isinstance(value, str):
        return _checked.text(value, f"{what}: {option.name}")
    if _checked.is_bool(value) and option.kind in _SWITCH_KINDS:
        return b"on" if value else b"off"
    integer = option.ctype in _checked.INTEGER_RANGES and option.kind not in _SWITCH_KINDS
    if integer and not _checked.is_bool(value) and hasattr(type(value), "__index__"):
        return str(_checked.integer(option.ctype, value, f"{what}: {option.name}")).encode()
    accepted = "a str" + (" or an int" if integer else "") + (" or a bool" if option.kind in _SWITCH_KINDS else "")
    raise TypeError(f"refpool: {what}: {option.name} must be {accepted} ({option.allowed}), not "
                    f"{type(value).__name__}")


def texts(values, what):
    """name -> text of each option given (None: not given), as the bytes C reads. Raises TypeError for
    an unknown name or a value of the wrong type, ValueError for text with a NUL, ValueError or
    OverflowError for an int its C type cannot hold: all before anything reaches C."""
    options = table()
    checked = {}
    for name, value in values.items():
        option = options.get(name)
        if option is None:
            raise TypeError(f"refpool: {what}() got an unknown option {name!r}; cache options: {', '.join(options)}")
        if value is not None:
            checked[name] = _text(option, value, what)
    return checked


def cache_options(conf=None, values=None, from_environment=True, what="refpool.Cache"):
    """A filled refpool_cache_options: the defaults (with REFPOOL_CONF's cache options unless
    from_environment is False), then `conf`, then each option of `values` (name -> text or int)."""
    checked = texts(values or {}, what)
    if not _checked.is_bool(from_environment):  # "False" would be true
        raise TypeError(f"refpool: {what}: from_environment must be True or False, not {from_environment!r}")
    if conf is not None and not isinstance(conf, str):
        raise TypeError(f"refpool: {what}: conf must be a str such as 'rounding:pow2:4,segments:off', "
                        f"not {type(conf).__name__}")
    conf_text = None if conf is None else _checked.text(conf, f"{what}: conf")
    library = lib()
    options = struct_type()()
    init = "refpool_cache_options_from_environment" if from_environment else "refpool_cache_options_init"
    library.call(init, options)
    if conf_text is not None:
        library.call("refpool_cache_options_parse", options, conf_text)
    for name, text in checked.items():
        library.call("refpool_cache_options_set", options, name.encode(), text)
    return options
