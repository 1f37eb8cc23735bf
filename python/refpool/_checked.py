"""Checked conversion of Python values into the C types of refpool.h, used for every argument of
every C call (_library.Library.fn) and every integer field of the option structs (_types.Checked).

ctypes converts an int to size_t, int or void* modulo 2^N without a word: 2**64 + 4096 bytes became
4096, and a limit of 2**64 became 0 (issue 23 row 10). Here a value is checked against its C type
before anything reaches C: a wrong type raises TypeError, a negative size ValueError, a value
outside the type's range OverflowError, each naming the function and parameter.

Text goes to C as a NUL-terminated char*, which ctypes passes without a word about a NUL inside:
"segments:off\0junk" was read as "segments:off" and a plan key "\0named" as no key (issue 35 row 8).
Text is UTF-8 here, and a NUL in it (or a str that UTF-8 cannot encode) is a ValueError."""
import ctypes
import operator

try:
    ssize_t = ctypes.c_ssize_t  # ptrdiff_t, as PyTorch's allocator hook takes sizes
except AttributeError:  # pragma: no cover (every supported Python has it)
    ssize_t = ctypes.c_long


def _unsigned(ctype):
    return 0, (1 << (8 * ctypes.sizeof(ctype))) - 1


def _signed(ctype):
    bits = 8 * ctypes.sizeof(ctype)
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


# C integer type -> (lowest, highest) value it holds.
INTEGER_RANGES = {ctype: _unsigned(ctype) for ctype in (ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint32)}
INTEGER_RANGES.update({ctype: _signed(ctype) for ctype in (ctypes.c_int, ctypes.c_long, ssize_t, ctypes.c_int64)})
ADDRESS_RANGE = _unsigned(ctypes.c_void_p)
_C_OBJECTS = (ctypes._SimpleCData, ctypes.Array, ctypes._Pointer, type(ctypes.byref(ctypes.c_int())))


def is_bool(value):
    """Whether `value` is a bool: Python's, or NumPy's (numpy.bool_, which NumPy 1.x still lets
    operator.index read as 0 or 1, with a DeprecationWarning), without importing NumPy."""
    kind = type(value)
    return kind is bool or (kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"))


def _as_int(value, what):
    # bool is an int to Python, but True as a byte count is a bug; floats would be truncated.
    if is_bool(value):
        raise TypeError(f"refpool: {what} must be an int, not {type(value).__name__}")
    try:
        return operator.index(value)  # int, or an int-like such as numpy.int64
    except TypeError:
        raise TypeError(f"refpool: {what} must be an int, not {type(value).__name__}") from None


def integer(ctype, value, what):
    """`value` as an int that `ctype` holds exactly; raises TypeError, ValueError or OverflowError."""
    low, high = INTEGER_RANGES[ctype]
    if type(value) is int and low <= value <= high:  # the common case, first and cheap
        return value
    number = _as_int(value, what)
    if number < 0 and low == 0:
        raise ValueError(f"refpool: {what} is {number}; it cannot be negative")
    if not low <= number <= high:
        raise OverflowError(f"refpool: {what} is {number}, outside {ctype.__name__} ({low} to {high})")
    return number


def address(value, what):
    """A void* argument: None or 0 (NULL), an int address, or a ctypes object (passed as it is)."""
    if value is None or isinstance(value, _C_OBJECTS):
        return value
    if type(value) is int and 0 < value <= ADDRESS_RANGE[1]:
        return value
    number = _as_int(value, what)
    if number < 0:
        raise ValueError(f"refpool: {what} is {number}; an address cannot be negative")
    if number > ADDRESS_RANGE[1]:
        raise OverflowError(f"refpool: {what} is {number}, beyond the largest address ({ADDRESS_RANGE[1]})")
    return number or None


def text(value, what):
    """`value` (a str, or bytes) as the bytes C reads: UTF-8, with no NUL inside. Raises TypeError
    for another type, ValueError for a NUL or a str that is not encodable text (a lone surrogate)."""
    if isinstance(value, str):
        try:
            data = str.encode(value, "utf-8")  # not a subclass's encode()
        except UnicodeEncodeError as e:
            raise ValueError(f"refpool: {what} {value!r} is not text C can read: character {e.start} "
                             f"({value[e.start]!r}) has no UTF-8 encoding") from None
    elif isinstance(value, bytes):
        data = bytes(value)
    else:
        raise TypeError(f"refpool: {what} must be a str, not {type(value).__name__}")
    if b"\0" in data:
        raise ValueError(f"refpool: {what} {value!r} holds a NUL character at {data.index(0)}: C would read only "
                         "the text before it")
    return data


def optional_text(value, what):
    """A char* argument: None (NULL) or text()."""
    return None if value is None else text(value, what)


def converter(ctype):
    """The check for parameters of `ctype`: (value, what) -> the value to pass. None where ctypes'
    own type check is enough (handles, structs and pointers to them, which this package makes)."""
    if ctype in INTEGER_RANGES:
        low, high = INTEGER_RANGES[ctype]

        def check_integer(value, what):
            if type(value) is int and low <= value <= high:  # inline: this runs for every argument
                return value
            return integer(ctype, value, what)
        return check_integer
    if ctype is ctypes.c_void_p:
        return address
    if ctype is ctypes.c_char_p:
        return optional_text
    return None


# What is no sequence of dims though it iterates: text and bytes (their items are characters or
# bytes) and sets (their order is arbitrary: {3, 1} may give (1, 3)).
NOT_DIMS = (str, bytes, bytearray, memoryview, set, frozenset)


def size_array(values, what):
    """A size_t array of `values` (at least one element, for C's sake) and its length."""
    if isinstance(values, NOT_DIMS):
        raise TypeError(f"refpool: {what} must be a sequence of ints, not {type(values).__name__}")
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"refpool: {what} must be a sequence of ints, not {type(values).__name__}") from None
    sizes = [integer(ctypes.c_size_t, value, f"{what}[{i}]") for i, value in enumerate(values)]
    return (ctypes.c_size_t * max(len(sizes), 1))(*sizes), len(sizes)


class Struct:
    """A struct parameter: the caller passes the ctypes struct (None: NULL) and C gets its address,
    then, `sized`, its size in bytes as one more argument (refpool.h, "Structs that grow": the
    caller passes sizeof its struct). So a function that gains a size parameter changes in its
    signature only (BY_ADDRESS -> SIZED), never at its call sites."""

    def __init__(self, sized):
        self.sized = sized

    def c_types(self):
        return [ctypes.c_void_p, ctypes.c_size_t] if self.sized else [ctypes.c_void_p]


BY_ADDRESS = Struct(sized=False)
SIZED = Struct(sized=True)
_STRUCTS = (ctypes.Structure, ctypes.Array)


def struct_address(value, what):
    """(address, size in bytes) of a ctypes struct (or array) argument."""
    if not isinstance(value, _STRUCTS):
        raise TypeError(f"refpool: {what} must be a ctypes struct, not {type(value).__name__}")
    return ctypes.byref(value), ctypes.sizeof(value)


def c_types(parameters):
    """The C argument types of a signature's parameters (a Struct may stand for two)."""
    return [c for _, ctype in parameters for c in (ctype.c_types() if isinstance(ctype, Struct) else [ctype])]


def checked_function(name, raw, parameters):
    """`raw` (a ctypes function) behind a Python function of the same name and parameters that checks
    each argument first. Generated once per function, so the common case (an int in range, None for
    a pointer) costs one inline test per argument and no extra call."""
    names = [f"a{i}_{parameter}" for i, (parameter, _) in enumerate(parameters)]
    scope = {"raw": raw, "struct_address": struct_address}
    lines = [f"def {name}({', '.join(names)}):"]
    arguments = list(names)
    for i, ((parameter, ctype), arg) in enumerate(zip(parameters, names)):
        if isinstance(ctype, Struct):
            scope[f"what{i}"] = f"{name}: {parameter}"
            lines.append(f"    size{i} = 0")  # NULL: C ignores the size
            lines.append(f"    if {arg} is not None:")
            lines.append(f"        {arg}, size{i} = struct_address({arg}, what{i})")
            if ctype.sized:
                arguments[i] = f"{arg}, size{i}"
            continue
        check = converter(ctype)
        if check is None:
            continue
        scope[f"check{i}"], scope[f"what{i}"] = check, f"{name}: {parameter}"
        if ctype is ctypes.c_void_p:
            fast = f"{arg} is None or (type({arg}) is int and 0 < {arg} <= {ADDRESS_RANGE[1]})"
        elif ctype is ctypes.c_char_p:
            fast = f"{arg} is None or (type({arg}) is bytes and 0 not in {arg})"
        else:
            low, high = INTEGER_RANGES[ctype]
            fast = f"type({arg}) is int and {low} <= {arg} <= {high}"
        lines.append(f"    if not ({fast}):")
        lines.append(f"        {arg} = check{i}({arg}, what{i})")
    lines.append(f"    return raw({', '.join(arguments)})")
    exec("\n".join(lines), scope)  # noqa: S102 (code made here from the signature table only)
    function = scope[name]
    function.raw = raw
    return function
