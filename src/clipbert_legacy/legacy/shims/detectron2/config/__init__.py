"""detectron2.config: ``get_cfg``, ``CfgNode`` (``_BASE_`` files, safe YAML), ``configurable``,
``global_cfg``."""
from .config import CfgNode, configurable, get_cfg, global_cfg, set_global_cfg

__all__ = ["CfgNode", "get_cfg", "global_cfg", "set_global_cfg", "configurable"]
