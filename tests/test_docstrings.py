"""Every public function and class of companion has a docstring."""

import importlib
import inspect
import pkgutil

import pytest

import companion

MODULES = [m.name for m in pkgutil.walk_packages(companion.__path__, "companion.")]


@pytest.mark.parametrize("module_name", MODULES)
def test_public_api_is_documented(module_name):
    module = importlib.import_module(module_name)
    assert module.__doc__, f"{module_name} has no module docstring"
    public = getattr(module, "__all__", None)
    assert public is not None, f"{module_name} must declare __all__"
    missing = []
    for name in public:
        obj = getattr(module, name)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for method_name, method in vars(obj).items():
                if inspect.isfunction(method) and not method_name.startswith("_") and not inspect.getdoc(method):
                    missing.append(f"{name}.{method_name}")
    assert not missing, f"undocumented in {module_name}: {missing}"
