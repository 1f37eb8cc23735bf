#!/usr/bin/env python3
"""Check that lib/'s #include lines never run back up its floors (docs/design.md, "The owner model and
where the code lives").

Usage: python3 lib/check_layers.py [REPOSITORY_ROOT]   (default: the folder above this script)

Rooms: every folder of lib/ is one room, every other file of lib/ is one by its stem (byte_text.cpp and
byte_text.hpp are the room byte_text). A public header (include/refpool/...) belongs to the room that
implements it, its pairing (PUBLIC below); a header with nothing out of line belongs to no room and any
floor may include it. Each room stands on one floor (FLOORS, ground up).

An include runs up when the included file's room stands on a higher floor than the including file's. One
kind may: a public header's pairing with its implementation, where a lower floor names a public class
(a handle it holds, a struct it fills) whose out-of-line functions are defined above; each such include
is listed in PAIRINGS with the reason. Every other include that runs up is a failure, and so is a room
that defines members of a class declared in another room's header (the core implementing a public
header, for example). A lib/ file over MAX_FILE_LINES lines is a failure too (small files, one purpose).

Prints the rooms, the arrows between them (one per ordered pair of rooms) and those that run up, and exits
1 on a failure, or when PAIRINGS lists an include that no longer exists (so the list only shrinks).
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))

# Ground up. gpu/, cuda/, hip/ and host/ make `backend` handles over their resources, so they stand on
# the public face; the framework allocator uses both; the C API wraps everything.
FLOORS = [
    ("base", ["config", "ref_counted", "byte_text", "access"]),
    ("backend_state", ["backend_state"]),
    ("vm", ["vm"]),
    ("segments", ["segments"]),
    ("cache", ["cache"]),
    ("plan", ["plan"]),
    ("api", ["api"]),
    ("backends", ["host", "gpu", "cuda", "hip"]),
    ("framework", ["framework"]),
    ("c_api", ["c_api"]),
]

# The room of each public header: where its out-of-line functions are defined. None: declarations and
# inline code only (types, errors, interfaces any floor may implement).
PUBLIC = {
    "adaptors.hpp": "api",
    "alloc_cache.hpp": "api",
    "array.hpp": "api",
    "backend.hpp": "api",
    "cache_option_fields.h": None,
    "cache_options.hpp": "config",
    "config.hpp": None,
    "cuda.hpp": "gpu",
    "data_ref.hpp": "api",
    "detail/block_header.hpp": "api",
    "detail/export.hpp": None,
    "detail/gpu_runtime_namespace.inc": "gpu",
    "detail/ref_count.hpp": None,
    "error.hpp": None,
    "gpu.hpp": "gpu",
    "hip.hpp": "gpu",
    "pointer.hpp": "api",
    "refpool.h": "c_api",
    "refpool.hpp": "c_api",  # the umbrella of every C++ header: only the C API includes it
    "resource.hpp": None,
    "rounding.hpp": "config",
    "scope.hpp": "api",
    "shape.hpp": "api",
    "stats.hpp": "api",
    "stats_fields.h": None,
    "stats_format.hpp": None,
    "types.hpp": None,
    "virtual_memory.hpp": None,
}

# The includes that may run up: (including room, public header) -> why.
PAIRINGS = {
    ("access", "alloc_cache.hpp"): "the one door into the private members of the public classes names them",
    ("access", "backend.hpp"): "the one door into the private members of the public classes names them",
    ("access", "data_ref.hpp"): "the one door into the private members of the public classes names them",
    ("cache", "detail/block_header.hpp"): "a block is the block_header that data_ref's inline code reads",
    ("cache", "stats.hpp"): "the cache fills cache_stats; api/ only lists and prints it",
    ("segments", "backend.hpp"): "a segment heap holds a counted backend handle",
    ("plan", "backend.hpp"): "a plan holds a counted backend handle",
    ("plan", "stats.hpp"): "the plan store fills its part of cache_stats",
    ("config", "refpool.h"): "the option table names each option's C type, declared beside the C functions",
}

SOURCE = (".cpp", ".hpp", ".h", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(refpool/[^>]+)>)')
CLASS = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:class|struct)\s+(?:REFPOOL_API\s+|alignas\([^)]*\)\s+)?(\w+)\b[^;]*$")
MEMBER = re.compile(r"^(?!\s|//|#|}|{)[^(=;]*?\b(\w+)::~?\w+\s*\(")


MAX_FILE_LINES = 350  # no lib/ file longer (issue 36)

def room_of_lib(path):
    """The room of a file of lib/ (a path relative to lib/)."""
    head, _, rest = path.partition("/")
    return head if rest else os.path.splitext(head)[0]


def lib_files():
    lib = os.path.join(ROOT, "lib")
    for folder, _, names in os.walk(lib):
        for name in sorted(names):
            if name.endswith(SOURCE):
                yield os.path.relpath(os.path.join(folder, name), lib).replace(os.sep, "/")


def resolve(including, quoted):
    """The lib/ path a quoted include names: beside the including file, else from lib/."""
    beside = os.path.normpath(os.path.join(os.path.dirname(including), quoted)).replace(os.sep, "/")
    if os.path.exists(os.path.join(ROOT, "lib", beside)):
        return beside
    return os.path.normpath(quoted).replace(os.sep, "/")


def main():
    floor_of = {room: i for i, (_, rooms) in enumerate(FLOORS) for room in rooms}
    problems = []
    edges = {}  # (from room, to room) -> [(file, included)]
    used_pairings = set()
    files = list(lib_files())
    rooms = sorted({room_of_lib(f) for f in files})
    for room in rooms:
        if room not in floor_of:
            problems.append(f"room {room} (lib/{room}) stands on no floor: add it to FLOORS in lib/check_layers.py")
    public_dir = os.path.join(ROOT, "include", "refpool")
    for folder, _, names in os.walk(public_dir):
        for name in names:
            header = os.path.relpath(os.path.join(folder, name), public_dir).replace(os.sep, "/")
            header = header[: -len(".in")] if header.endswith(".in") else header
            if header.endswith((".h", ".hpp", ".inc")) and header not in PUBLIC:
                problems.append(f"public header refpool/{header} has no room: add it to PUBLIC in lib/check_layers.py")
    declared_in = {}  # class name -> room of the header that declares it
    for f in files:
        room = room_of_lib(f)
        with open(os.path.join(ROOT, "lib", f), encoding="utf-8") as text:
            lines = text.read().splitlines()
        if len(lines) > MAX_FILE_LINES:  # small files with one purpose (issue 36's limit)
            problems.append(f"lib/{f} has {len(lines)} lines, over {MAX_FILE_LINES}: split it by purpose")
        for line in lines:
            m = INCLUDE.match(line)
            if not m:
                continue
            if m.group(1):
                target = resolve(f, m.group(1))
                to_room, shown = room_of_lib(target), target
            else:
                header = m.group(2)[len("refpool/"):]
                to_room, shown = PUBLIC.get(header), m.group(2)
                if to_room is None:
                    continue
            if to_room != room:
                edges.setdefault((room, to_room), []).append((f, shown))
        if f.endswith((".hpp", ".h")):
            for line in lines:
                m = CLASS.match(line)
                if m:
                    declared_in.setdefault(m.group(1), room)
    for header, room in PUBLIC.items():
        if room is None or not os.path.exists(os.path.join(public_dir, header)):
            continue
        with open(os.path.join(public_dir, header), encoding="utf-8") as text:
            for line in text:
                m = CLASS.match(line.strip()) if "REFPOOL_API" in line else None
                if m:
                    declared_in[m.group(1)] = room
    # Out-of-line members defined outside the room that declares their class.
    for f in files:
        if not f.endswith(".cpp"):
            continue
        room = room_of_lib(f)
        with open(os.path.join(ROOT, "lib", f), encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                m = MEMBER.match(line)
                owner = declared_in.get(m.group(1)) if m else None
                if owner is not None and owner != room:
                    problems.append(f"lib/{f}:{number}: room {room} defines a member of {m.group(1)}, which room "
                                    f"{owner} declares: move it there")

    up = []
    for (a, b), incs in sorted(edges.items()):
        if a in floor_of and b in floor_of and floor_of[b] > floor_of[a]:
            up.append((a, b, incs))
            for f, shown in incs:
                key = (a, shown[len("refpool/"):]) if shown.startswith("refpool/") else None
                if key in PAIRINGS:
                    used_pairings.add(key)
                else:
                    problems.append(f"lib/{f} includes {shown}: room {a} ({FLOORS[floor_of[a]][0]}) reaches up "
                                    f"into room {b} ({FLOORS[floor_of[b]][0]})")
    for key in sorted(set(PAIRINGS) - used_pairings):
        problems.append(f"PAIRINGS lists {key[0]} -> refpool/{key[1]}, which no include needs any more: remove it")

    print(f"lib/: {len(rooms)} rooms on {len(FLOORS)} floors, {len(edges)} arrows between rooms, {len(up)} run up")
    for i, (name, members) in enumerate(FLOORS):
        print(f"  floor {i} {name}: {', '.join(r for r in members if r in rooms)}")
    for a, b, incs in up:
        print(f"  up: {a} -> {b}")
        for f, shown in incs:
            key = (a, shown[len("refpool/"):]) if shown.startswith("refpool/") else None
            why = PAIRINGS.get(key)
            print(f"    lib/{f} -> {shown}: " + (f"pairing ({why})" if why else "NOT ALLOWED"))
    for p in problems:
        print(p)
    print(f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
