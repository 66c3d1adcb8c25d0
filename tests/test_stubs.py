"""mmloader/_core.pyi declares exactly what the C extension exports: every module-level
name, and every public method/attribute of each class (a name added in csrc/py without a
stub line, or a stub line for a name that is gone, fails here).  Whether the package type
checks against the stub is scripts/test.sh's mypy step."""

from __future__ import annotations

import ast
import os

import pytest

from mmloader import _core

STUB = os.path.join(os.path.dirname(_core.__file__), "_core.pyi")
# what every extension type or module has without csrc/py declaring it
IMPLICIT = {"__init__", "__new__", "__repr__", "__doc__", "__module__", "__weakref__"}


def _stub():
    """(module-level names, {class name: member names}) declared in the stub; imports are
    and type aliases are the stub's own tools, not names of _core."""
    with open(STUB) as f:
        tree = ast.parse(f.read(), STUB)
    names, classes = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if ast.unparse(node.annotation) != "TypeAlias":  # the stub's own shorthand
                names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef)
            } - IMPLICIT
    return names, classes


def _module_names():
    return {n for n in dir(_core) if not (n.startswith("__") and n.endswith("__"))}


def test_stub_declares_every_name_of_the_module_and_no_other():
    declared, _ = _stub()
    real = _module_names()
    assert real, "the extension exports nothing?"
    assert real - declared == set(), "exported by _core but not in _core.pyi"
    assert declared - real == set(), "in _core.pyi but not exported by _core"


@pytest.mark.parametrize("cls", sorted(n for n in _stub()[1]))
def test_stub_declares_every_member_of_each_class(cls):
    declared = _stub()[1][cls]
    members = set(vars(getattr(_core, cls))) - IMPLICIT
    assert members - declared == set(), f"members of _core.{cls} missing in _core.pyi"
    assert declared - members == set(), f"_core.pyi declares members _core.{cls} lacks"


def test_loader_stats_typeddict_names_every_key(tmp_path):
    """mmloader.LoaderStats (the type of Loader.stats()) has exactly the keys a running
    loader reports (``fetch`` only with remote data), and SourceStats those of a source."""
    import typing

    import mmloader
    from mmloader.datagen import make_dataset
    from mmloader.loader import SourceStats

    ds = make_dataset(
        str(tmp_path), n_samples=8, seed=1, n_shards=1, n_images=2, min_size=32, max_size=48
    )
    with mmloader.Loader(ds["shards"], num_threads=1, micro_batch_size=2, tokenizer="tiny") as L:
        next(iter(L))
        st = L.stats()
    hints = typing.get_type_hints(mmloader.LoaderStats)
    assert mmloader.LoaderStats.__optional_keys__ == {"fetch"}
    assert set(st) == set(hints) - {"fetch"}
    for src in st["sources"].values():
        assert set(src) == set(typing.get_type_hints(SourceStats))


def test_torch_loader_has_loaders_typed_signature():
    """mmloader.torch.Loader takes every keyword of mmloader.Loader, typed as there, with
    Loader's default but for the five whose None its docstring resolves (by ``keys``, and
    pixel_format by ``device``); no
    **kwargs (a type checker and an IDE see every argument)."""
    import inspect
    import typing

    pytest.importorskip("torch")
    import mmloader
    import mmloader.torch as mt

    core = inspect.signature(mmloader.Loader.__init__).parameters
    ours = inspect.signature(mt.Loader.__init__).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in ours.values())
    assert set(ours) - set(core) == {"packing_keys"}
    assert set(core) - set(ours) == set()
    hints_core = typing.get_type_hints(mmloader.Loader.__init__)
    hints_ours = typing.get_type_hints(mt.Loader.__init__)
    for name in core:
        if name == "self":
            continue
        if name in mt._OWN_DEFAULTS:
            assert ours[name].default is None, name
            assert hints_ours[name] == typing.Optional[hints_core[name]], name
            assert f"``{name}``: None is" in (mt.Loader.__doc__ or ""), name
        else:
            assert ours[name].default == core[name].default, name
            assert hints_ours[name] == hints_core[name], name
        assert ours[name].kind is core[name].kind, name


def test_state_names_of_the_adapters_stay_in_the_adapters():
    """Issue 32: the core Loader (and the binding's type under it) saves and restores with
    state_dict / load_state_dict only; Megatron's and Energon's names (save_state,
    restore_state, their _rank and _global forms) are mmloader.megatron's."""
    import mmloader

    assert {"state_dict", "load_state_dict"} <= set(dir(mmloader.Loader))
    for cls in (mmloader.Loader, _core._Loader):
        names = [n for n in dir(cls) if n.startswith(("save_state", "restore_state"))]
        assert names == [], f"{cls.__name__}: {names}"
    pytest.importorskip("torch", reason="mmloader.megatron's loader is mmloader.torch's")
    from mmloader.megatron.state import Loader as MegatronLoader

    for name in ("save_state", "restore_state", "save_state_rank", "save_state_global"):
        assert callable(getattr(MegatronLoader, name)), name
