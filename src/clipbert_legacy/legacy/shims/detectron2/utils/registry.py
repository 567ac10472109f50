"""detectron2's ``Registry`` (fvcore's: ``@REG.register()``, ``REG.get(name)``) and a lookup whose miss is one
line naming the registry, the name and what is registered."""
from fvcore.common.registry import Registry

from clipbert_legacy.legacy.shims._unsupported import not_provided

__all__ = ["Registry", "lookup"]


def lookup(registry: Registry, name: str, config_key: str):
    """``registry.get(name)``; a name the registry lacks is :class:`NotProvidedError` naming
    ``config_key``."""
    try:
        return registry.get(name)
    except KeyError:
        known = ", ".join(sorted(getattr(registry, "_obj_map", {})))
        raise not_provided(f"detectron2's {registry._name} {name!r}",
                           f"{config_key}; registered here: {known or 'none'}") from None
