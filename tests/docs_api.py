"""The API reference's checks (tests/docs.cmake):

  doxygen DOXYGEN DOXYFILE WARNINGS  runs Doxygen over include/attn/*.hpp (docs/Doxyfile.in, its
                                     WARN_IF_UNDOCUMENTED on) and fails when its warnings name a
                                     function (free, member, operator, constructor) with no doc
                                     comment; the other undocumented entities are counted
  python                             every public name of the Python package (`attn`'s exports and the
                                     public names of attn.torch, attn.flash and attn.distributed where
                                     PyTorch and mpi4py import) has a docstring beyond its signature,
                                     and so has every public method, property and __init__ of its
                                     classes
"""
import importlib
import inspect
import re
import subprocess
import sys


def check_doxygen(doxygen, doxyfile, warnings):
    r = subprocess.run([doxygen, doxyfile], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        return 1
    lines = [line for line in open(warnings).read().splitlines() if line.strip()]
    functions = [line for line in lines if re.search(r"\((function|friend)\)", line)]
    others = [line for line in lines if line not in functions]
    for line in functions:
        print(line)
    print(f"doxygen: {len(functions)} public functions without a doc comment; "
          f"{len(others)} other warnings (members, types; not counted as failures)")
    return 1 if functions else 0


def documented(obj, name):
    """The docstring without pybind11's signature lines ("name(a: int) -> None", "Overloaded function.")."""
    doc = inspect.getdoc(obj) or ""
    text = [line for line in doc.splitlines()
            if not re.match(rf"^\s*(\d+\.\s*)?{re.escape(name)}\(.*\)( -> .*)?$", line)
            and line.strip() not in ("", "Overloaded function.")]
    return bool(text)


def public(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    out = []
    for n in names:
        obj = getattr(module, n)
        if inspect.ismodule(obj):
            continue
        owner = getattr(obj, "__module__", module.__name__) or module.__name__
        if not owner.startswith("attn"):
            continue  # names the module imports (torch, numpy)
        out.append((n, obj))
    return out


def check_python():
    missing, checked = [], 0
    for modname in ("attn", "attn.torch", "attn.flash", "attn.distributed"):
        try:
            module = importlib.import_module(modname)
        except ImportError as e:  # attn.torch needs PyTorch, attn.distributed mpi4py; nothing else may be missing
            if modname == "attn" or e.name not in ("torch", "mpi4py"):
                raise
            print(f"{modname}: not checked ({e})")
            continue
        checked += 1
        if not documented(module, modname):
            missing.append(modname)
        for name, obj in public(module):
            checked += 1
            if not documented(obj, name):
                missing.append(f"{modname}.{name}")
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if member.startswith("_") and member not in ("__init__", "__call__"):
                        continue
                    if not (callable(value) or isinstance(value, property) or type(value).__name__ == "property"):
                        continue
                    if member == "__init__" and not hasattr(value, "__doc__"):
                        continue
                    checked += 1
                    if not documented(getattr(obj, member), member):
                        missing.append(f"{modname}.{name}.{member}")
    for name in missing:
        print(f"no docstring: {name}")
    print(f"python: {checked} public names and class members checked, {len(missing)} without a docstring")
    return 1 if missing else 0


if __name__ == "__main__":
    if sys.argv[1] == "doxygen":
        sys.exit(check_doxygen(*sys.argv[2:5]))
    sys.exit(check_python())
