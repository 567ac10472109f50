"""detectron2's ``PROPOSAL_GENERATOR_REGISTRY`` and ``build_proposal_generator``."""
from ...utils.registry import Registry, lookup

__all__ = ["PROPOSAL_GENERATOR_REGISTRY", "build_proposal_generator"]

PROPOSAL_GENERATOR_REGISTRY = Registry("PROPOSAL_GENERATOR")


def build_proposal_generator(cfg, input_shape):
    """The generator named by ``MODEL.PROPOSAL_GENERATOR.NAME``; None for ``PrecomputedProposals``."""
    name = cfg.MODEL.PROPOSAL_GENERATOR.NAME
    if name == "PrecomputedProposals":
        return None
    return lookup(PROPOSAL_GENERATOR_REGISTRY, name, "MODEL.PROPOSAL_GENERATOR.NAME")(cfg, input_shape)
