"""The loading sub-step rules: one table of data, read top to bottom.

Each rule matches host events of the ``load`` stage by kind and name (a regular expression, ``re.search``). A
matching event and everything nested inside it on its thread get the rule's sub-step, unless a rule of higher
priority matches the event or one of its ancestors; on equal priority the innermost match wins (so
``from_model_config``, which reads the generation config inside ``PreTrainedModel.__init__``, counts as config).
GPU activity takes the sub-step of the runtime call that launched it. Load-stage time under no rule is
``unattributed``: shown, never hidden.

Python frame names are ``<path relative to site-packages>(<first line>): <function>``; the patterns below cover
transformers 4.x and 5.x, safetensors, torch and accelerate (see docs/analyses.md and docs/capture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

CONFIG = "config"
CLASS_RESOLUTION = "class_resolution"
INSTANTIATE = "instantiate"
LOAD_WEIGHTS = "load_weights"
TO_DEVICE = "to_device"
UNATTRIBUTED = "unattributed"
SUBSTEPS: tuple[str, ...] = (CONFIG, CLASS_RESOLUTION, INSTANTIATE, LOAD_WEIGHTS, TO_DEVICE, UNATTRIBUTED)


@dataclass(frozen=True)
class LoadRule:
    """One row of the loading sub-step rule table."""

    name: str
    substep: str
    priority: int
    pattern: str
    kinds: tuple[str, ...] = ("python_function",)
    doc: str = ""


PY = ("python_function",)
MARK = ("user_annotation", "cpu_op")
_TF = r"^transformers/"

# fmt: off
LOAD_RULES: tuple[LoadRule, ...] = (
    # -- profparse's own load marks (profparse.base.marks.load_mark); profparse.load:from_pretrained is an umbrella ----
    *(LoadRule(f"load_mark.{s}", s, 100, rf"^profparse\.load:{s}$", MARK, doc=f"profparse.load:{s} range")
      for s in (CONFIG, CLASS_RESOLUTION, INSTANTIATE, LOAD_WEIGHTS, TO_DEVICE)),
    # -- config read and parse -------------------------------------------------------------------------------------
    LoadRule("config.transformers", CONFIG, 50,
             _TF + r"(configuration_utils|models/auto/configuration_auto)\.py\(\d+\): (from_pretrained|get_config_dict"
             r"|_get_config_dict|from_dict|from_json_file|_dict_from_json_file)$",
             doc="AutoConfig / PretrainedConfig.from_pretrained: find, read and parse config.json"),
    LoadRule("config.class", CONFIG, 50,
             _TF + r"models/[\w/]+/configuration_\w+\.py\(\d+\): (__init__|__post_init__)$",
             doc="a model's config class being built"),
    LoadRule("config.generation", CONFIG, 50,
             _TF + r"generation/configuration_utils\.py\(\d+\): (from_pretrained|from_model_config|from_dict)$",
             doc="GenerationConfig read (generation_config.json) or derived from the model config"),
    # -- architecture class resolution -------------------------------------------------------------------------------
    LoadRule("class.auto_mapping", CLASS_RESOLUTION, 50,
             _TF + r"models/auto/(auto_factory|configuration_auto)\.py\(\d+\): (_get_model_class|__getitem__"
             r"|_load_attr_from_module|getattribute_from_module|model_type_to_module_name)$",
             doc="auto-class mapping: config.architectures / model_type -> class, lazily importing its module"),
    LoadRule("class.remote_code", CLASS_RESOLUTION, 50,
             _TF + r"dynamic_module_utils\.py\(\d+\): (get_class_from_dynamic_module|get_class_in_module)$",
             doc="trust_remote_code: fetch and import the model's own code"),
    LoadRule("class.lazy_import", CLASS_RESOLUTION, 20,
             r"^<frozen importlib\._bootstrap(_external)?>|^importlib/__init__\.py\(\d+\): import_module$"
             r"|^transformers/utils/import_utils\.py\(\d+\): (_get_module|__getattr__)$",
             doc="module imports outside any other sub-step (lower priority: an import inside weight loading "
                 "stays weight loading)"),
    # -- module tree instantiation -----------------------------------------------------------------------------------
    LoadRule("instantiate.init", INSTANTIATE, 50,
             r"^(transformers/models/[\w/]+/modeling_\w+|transformers/modeling_utils|torch/nn/modules/\w+"
             r"|transformers_modules/.+)\.py\(\d+\): __init__$",
             doc="recursive __init__ of the model's modules (transformers models, torch.nn, remote code)"),
    LoadRule("instantiate.weights_init", INSTANTIATE, 50,
             _TF + r"modeling_utils\.py\(\d+\): (post_init|_from_config|init_weights|_init_weights"
             r"|_initialize_weights|initialize_weights|_initialize_missing_keys)$"
             r"|^torch/nn/modules/\w+\.py\(\d+\): (reset_parameters|_reset_parameters)$",
             doc="parameter creation and initialisation (also of keys missing from the checkpoint)"),
    # -- weight loading ------------------------------------------------------------------------------------------------
    LoadRule("weights.transformers", LOAD_WEIGHTS, 50,
             _TF + r"modeling_utils\.py\(\d+\): (_load_pretrained_model|load_state_dict"
             r"|_load_state_dict_into_meta_model|_load_state_dict_into_model|load_shard_file|load_shard_files|_load_checkpoint|_finalize_model_loading"
             r"|_get_resolved_checkpoint_files|caching_allocator_warmup)$"
             r"|^transformers/(core_model_loading|conversion_mapping)\.py\(\d+\): "
             r"|^transformers/utils/hub\.py\(\d+\): get_checkpoint_shard_files$"
             r"|^transformers/distributed/checkpoint\.py\(\d+\): ",
             doc="transformers' checkpoint loading: find shards, convert keys, materialise and assign tensors"),
    LoadRule("weights.safetensors", LOAD_WEIGHTS, 50,
             r"^safetensors/|<built-in method \w+ of builtins\.safe_open object",
             doc="safetensors file access (open/mmap, get_tensor/get_slice)"),
    LoadRule("weights.torch", LOAD_WEIGHTS, 50,
             r"^torch/serialization\.py\(\d+\): load$|^torch/nn/modules/module\.py\(\d+\): (load_state_dict"
             r"|_load_from_state_dict)$",
             doc="torch.load and Module.load_state_dict"),
    LoadRule("weights.accelerate", LOAD_WEIGHTS, 50,
             r"^accelerate/utils/modeling\.py\(\d+\): (set_module_tensor_to_device|load_checkpoint_in_model"
             r"|load_state_dict)$",
             doc="accelerate's meta-device loading (transformers 4.x low_cpu_mem_usage / device_map)"),
    # -- device transfer -----------------------------------------------------------------------------------------------
    LoadRule("device.module_to", TO_DEVICE, 50,
             r"^torch/nn/modules/module\.py\(\d+\): (to|cuda|xpu|to_empty|_apply)$"
             r"|^transformers/modeling_utils\.py\(\d+\): (to|cuda)$",
             doc="Module.to / .cuda (device or dtype), recursive _apply"),
    LoadRule("device.dispatch", TO_DEVICE, 50, r"^accelerate/big_modeling\.py\(\d+\): dispatch_model$",
             doc="accelerate dispatch_model (device_map placement)"),
)
# fmt: on


def load_rules() -> list[LoadRule]:
    """The rules, highest priority first."""
    return sorted(LOAD_RULES, key=lambda r: -r.priority)


def load_rules_markdown() -> str:
    """The rule table as Markdown (docs/analyses.md embeds it; a test keeps the two in sync)."""
    lines = ["| priority | rule | sub-step | kinds | name pattern | what it is |", "|---:|---|---|---|---|---|"]
    for r in load_rules():
        pattern = f"`{r.pattern}`".replace("|", "\\|")
        lines.append(f"| {r.priority} | `{r.name}` | {r.substep} | {', '.join(r.kinds)} | {pattern} | {r.doc} |")
    return "\n".join(lines) + "\n"
