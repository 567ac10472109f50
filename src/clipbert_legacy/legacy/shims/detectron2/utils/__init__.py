"""detectron2.utils: logger, comm, registry, env."""
