"""``release fixture tiny|nano``: a checkpoint of the real Cosmos3 architecture and DROID-like observations.

The checkpoint is the diffusers folder layout of ``nvidia/Cosmos3-Nano-Policy-DROID`` built from the real
``Cosmos3OmniTransformer`` class with a tiny config and weights from a fixed seed, so every later stage runs the
same code as on the 15.7B model; ``nano`` writes the 15.7B model's own sizes with random weights, for speed and scale
runs on a GPU. Its revision is a content hash of the files. The tiny fixture also holds a reference FP8 checkpoint
of its source made by ModelOpt's own export (:mod:`release.inputs.reference`), recorded in ``fixture.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from release.core.errors import ReleaseError
from release.core.io import atomic_dir, output_folder, read_json, sha256_file, write_json
from release.core.output import info, progress
from release.inputs.observations import LABS, write_observations
from release.inputs.reference import REFERENCE_DIR, write_reference

# diffusers' Cosmos3OmniTransformer at a size a 2-core CPU runs in milliseconds (domain notes §9).
TINY_TRANSFORMER = dict(
    hidden_size=64,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    num_hidden_layers=2,
    vocab_size=1000,
    latent_channel=4,
    patch_latent_dim=16,
    latent_patch_size=2,
    rope_axes_dim=[4, 2, 2],
    action_gen=True,
    action_dim=64,
    num_embodiment_domains=32,
    sound_gen=False,
)
TINY_VAE = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    is_residual=True,
    patch_size=2,
    in_channels=12,
    out_channels=12,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
# Qwen's chat template, as the Cosmos3 text tokenizer uses it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The full Nano: diffusers' defaults are its sizes (domain notes §2); random weights, for speed and scale runs.
NANO_TRANSFORMER = dict(action_gen=True, action_dim=64, num_embodiment_domains=32, sound_gen=False)
NANO_VAE = {**TINY_VAE, "z_dim": 48, "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48}  # Nano's 48 channels
# transformer config, VAE config, shard size (the tiny one small enough to give several shards; Nano's as NVIDIA's)
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "tiny": (TINY_TRANSFORMER, TINY_VAE, "400KB"), "nano": (NANO_TRANSFORMER, NANO_VAE, "5GB")}


def build_transformer(seed: int, size: str = "tiny") -> torch.nn.Module:
    """The transformer at ``size``: the tiny one on the CPU (its bytes define the fixture's revision), the Nano on
    CUDA when present (15.7B parameters initialise in seconds there)."""
    from diffusers import Cosmos3OmniTransformer

    from release.core.device import compute_device

    torch.manual_seed(seed)
    with torch.device("cpu" if size == "tiny" else compute_device()):
        model = Cosmos3OmniTransformer(**SIZES[size][0])
    with torch.no_grad():
        # nn.Embedding initialises N(0, 1): far too large for a per-domain weight matrix of 64 x 64.
        for head in (model.action_proj_in, model.action_proj_out):
            head.fc.weight.mul_(0.02)
            head.bias.weight.zero_()
    with torch.no_grad():  # bf16 everywhere but time_embedder, which diffusers keeps fp32 (_keep_in_fp32_modules)
        for name, param in model.named_parameters():
            if not name.startswith("time_embedder."):
                param.data = param.data.to(torch.bfloat16)
    return model.eval()


def build_tokenizer(corpus: list[str]):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def content_revision(root: Path) -> str:
    """sha256 over every file's relative path and content hash: the checkpoint's revision."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "fixture.json":
            h.update(p.relative_to(root).as_posix().encode())
            h.update(bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def write_fixture(out: Path, size: str = "tiny", seed: int = 0, n_obs: int = 32,
                  heldout: int = 16) -> dict[str, str]:
    """Write ``out/source`` (checkpoint), ``out/observations`` (observation set) and, for the tiny size,
    ``out/reference`` (ModelOpt's own FP8 export of the source, :mod:`release.inputs.reference`); return their
    paths. It says what it writes, then each part's seconds once done."""
    if output_folder(out).exists() and any(out.iterdir()):
        raise ReleaseError(f"{out}: folder exists and is not empty; choose another --out or remove it")
    _, vae_config, shard_size = SIZES[size]
    reference = size == "tiny"  # the Nano's would take another GPU calibration and 16 GB
    info(f"fixture {size}: writing {out}: source, {n_obs} calibration and {heldout} held-out observations"
         f"{', reference' if reference else ''}")
    with progress(f"fixture {size}") as bar, atomic_dir(out) as tmp:
        with bar.part("source"):
            src = _write_source(tmp / "source", size, seed, vae_config, shard_size)
            revision = content_revision(src)
        with bar.part("observations"):
            write_observations(tmp / "observations", n=n_obs, seed=seed, labs=LABS, heldout=heldout)
        record: dict[str, Any] = {"generator": f"release fixture {size}", "seed": seed, "revision": revision}
        if reference:
            with bar.part("reference"):
                write_reference(tmp / REFERENCE_DIR, src, tmp / "observations", record["generator"], revision)
            record["reference"] = f"../{REFERENCE_DIR}"
        write_json(src / "fixture.json", record)
    paths = {"source": str(out / "source"), "observations": str(out / "observations"), "revision": revision}
    return {**paths, "reference": str(out / REFERENCE_DIR)} if reference else paths


def _write_source(src: Path, size: str, seed: int, vae_config: dict[str, Any], shard_size: str) -> Path:
    """The checkpoint at ``src``, in the diffusers folder layout with NVIDIA's root files."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler

    from release.inputs.policy import JointPositionPolicyPipeline, instruction_corpus

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**vae_config).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    transformer = build_transformer(seed, size)
    pipe = JointPositionPolicyPipeline(
        # the pipeline writes its small components; a Nano transformer is written once, on its own, below
        transformer=transformer if size == "tiny" else build_transformer(seed),
        text_tokenizer=build_tokenizer(instruction_corpus()),
        vae=vae,
        scheduler=scheduler,
        enable_safety_checker=False,
    )
    pipe.save_pretrained(src)
    # Sharded explicitly: once ModelOpt has patched ModelMixin.save_pretrained (enable_huggingface_checkpointing),
    # the pipeline no longer forwards max_shard_size to its components.
    shutil.rmtree(src / "transformer")
    on_cpu: Any = transformer.to("cpu")
    on_cpu.save_pretrained(src / "transformer", max_shard_size=shard_size)
    index = json.loads((src / "model_index.json").read_text())
    write_json(src / "model_index.json", {**index, "_class_name": "Cosmos3OmniPipeline"})  # the base repo's class
    _write_root_files(src)
    return src


def fixture_reference(source: Path) -> Path | None:
    """The reference checkpoint a fixture recorded for ``source`` (``fixture.json``'s ``reference``, relative to the
    source: ModelOpt's own export, :mod:`release.inputs.reference`), or None for any other source."""
    path = source / "fixture.json"
    if not path.is_file():
        return None
    recorded = read_json(path, "the fixture's record", "release fixture").get("reference")
    if recorded is None:
        return None
    reference = Path(os.path.normpath(source / str(recorded)))
    if not (reference / "provenance.json").is_file():
        raise ReleaseError(f"{path}: field 'reference' names {reference}, which holds no reference checkpoint; "
                           "rerun 'release fixture' or pass --reference DIR")
    return reference


def _write_root_files(src: Path) -> None:
    """Root ``config.json`` and ``model.safetensors.index.json`` as in NVIDIA's folder layout.

    The root index is the reasoner's view of the transformer's weights: it maps every tensor to its shard under
    ``transformer/`` (no data is duplicated).
    """
    tcfg = json.loads((src / "transformer" / "config.json").read_text())
    write_json(src / "config.json", {"model_type": "cosmos3_omni", "architectures": ["Cosmos3OmniTransformer"],
                                     **{k: v for k, v in tcfg.items() if not k.startswith("_")}})
    index_path = src / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    if not index_path.is_file():
        raise ReleaseError(f"{src}/transformer: expected a sharded checkpoint; lower the shard size")
    index = json.loads(index_path.read_text())
    write_json(src / "model.safetensors.index.json", {
        "metadata": index.get("metadata", {}),
        "weight_map": {k: f"transformer/{v}" for k, v in sorted(index["weight_map"].items())},
    })

