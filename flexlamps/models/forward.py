"""The forward implementations, by the key a family names (`Family.forward`)."""

from flexlamps.models.blocks.decoder import DecoderForward
from flexlamps.models.blocks.hybrid_decoder import HybridForward
from flexlamps.models.blocks.mla_decoder import DeepseekForward
from flexlamps.models.blocks.opt_decoder import OptForward
from flexlamps.models.config import ModelConfig
from flexlamps.models.families import family_for

FORWARDS = {"decoder": DecoderForward, "opt": OptForward, "mla": DeepseekForward, "hybrid": HybridForward}


def forward_for(cfg: ModelConfig):
    return FORWARDS[family_for(cfg.model_type).forward](cfg)
