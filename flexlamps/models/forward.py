"""Pick the forward implementation for a config's architecture."""

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.deepseek import DeepseekForward
from flexlamps.models.families.llama import LlamaForward
from flexlamps.models.families.opt import OptForward


def forward_for(cfg: ModelConfig):
    if cfg.arch == "mla":
        return DeepseekForward(cfg)
    return LlamaForward(cfg) if cfg.arch == "llama" else OptForward(cfg)
