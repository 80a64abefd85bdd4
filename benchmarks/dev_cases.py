"""Predicted against published single-GPU training throughput (NVIDIA DeepLearningExamples).

Reads the single-GPU rows of published/dev_cases.yaml, predicts
each with gpusim, and prints predicted, measured and the relative error, then the MAPE. These
rows are a first check, never fitted: the calibration files say what they were built from.

    python benchmarks/dev_cases.py [path/to/dev_cases.yaml]
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpusim.errors import GpusimError
from gpusim.estimation import build_job, estimate, simulate_step
from gpusim.hardware.calibration import calibration_for
from gpusim.hardware.catalog import load_gpu
from gpusim.stack import Stack, load_stack
from gpusim.workload.model import Model
from gpusim.workload.zoo.transformer import TRANSFORMERS, build_transformer
from gpusim.workload.zoo.transformer_xl import TRANSFORMER_XLS, build_transformer_xl

DEFAULT = Path(__file__).resolve().parents[1] / "published" / "dev_cases.yaml"
GPUS = {"A100 80GB": "a100-80gb", "A100 40GB": "a100-40gb", "V100 16GB": "v100-sxm2-16gb",
        "V100 32GB": "v100-sxm2-32gb"}
SYSTEMS = {"DGX A100": "dgx-a100", "DGX-1": "dgx-1"}  # hardware text -> system profile
PRECISIONS = {"TF32": "tf32", "AMP": "fp16", "FP16": "fp16", "FP16 mixed": "fp16", "FP32": "fp32"}
SQUAD_SEQ_LEN = 384  # DeepLearningExamples run_squad.sh default max_seq_length
# Masked positions the pre-training head runs on: DeepLearningExamples' BERT gathers them
# before the head (modeling.py BertPreTrainingHeads, sequence_output_is_dense, on unless
# --no_dense_sequence_output), at most max_predictions_per_seq per sequence
# (scripts/run_pretraining.sh @729963dd4: 20 at length 128, 80 at 512).
MAX_PREDICTIONS = {128: 20, 512: 80}
# DeepLearningExamples' Transformer-XL steps its optimizer one tensor at a time: lamb.py
# @729963dd4 JITLamb.step loops over group['params'] (a TorchScript update per tensor), and
# train.py clips with torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer)), one norm
# per tensor in the PyTorch of its container (20.06).
TXL_STACK = load_stack("pytorch").model_copy(update={"optimizer": "per_tensor"})
# DeepLearningExamples' SQuAD fine-tuning reads the gradients' norm on the host before every
# optimizer step, and without --fp16 steps BertAdam, a Python loop that also clips each
# parameter by its own norm; with --fp16 it steps apex's FusedAdam under amp O2 (the fp32
# master weights _samples_per_s gives fp16 rows).
_SQUAD = "NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/run_squad.py @729963dd4"
_PYTORCH = load_stack("pytorch")


def _squad_stack(bert_adam: bool) -> Stack:
    sources = {**_PYTORCH.sources, "sync_before_step": (
        f"{_SQUAD}: GradientClipper.step calls total_norm.item() on apex's "
        "multi_tensor_l2norm before optimizer.step(), every step")}
    if bert_adam:
        sources["optimizer"] = (f"{_SQUAD}: BertAdam unless --fp16; optimization.py @729963dd4 "
                                "BertAdam.step loops over the parameters")
    return Stack.model_validate({**_PYTORCH.model_dump(), "sources": sources,
                                 "sync_before_step": True,
                                 "optimizer": "bert_adam" if bert_adam else _PYTORCH.optimizer})


SQUAD_STACKS = {False: _squad_stack(bert_adam=True), True: _squad_stack(bert_adam=False)}
PHASE2_BINNED = ("phase 2 trains on sequences binned by length (scripts/run_pretraining.sh "
                 "@729963dd4 reads pretrain/phase2/bin_size_64: each batch is padded to its "
                 "bin, not to 512), and the mean length is not stated")


def bert_batches(row: dict[str, Any]) -> tuple[int, int] | None:
    """(microbatch, accumulated batch) per GPU of a BERT row, or None when not stated as one
    number. The DGX-1 table prints only the accumulated batch ('4096 and 4096') and the
    accumulation steps ('128 and 64', FP32 then FP16); run_pretraining.py @729963dd4 divides
    the one by the other to get the microbatch."""
    par = row["parallelism"]
    if par.get("batch_per_gpu") is not None:
        if not str(par["batch_per_gpu"]).isdigit():  # one per precision: the caller parses it
            return None
        micro = int(par["batch_per_gpu"])
        return micro, int(par.get("accumulated_batch_per_gpu") or micro)
    printed, steps = par.get("batch_column_as_printed"), par.get("accumulation_steps_as_printed")
    if not printed or not steps:
        return None
    which = 0 if par["precision"].split()[0] in ("FP32", "TF32") else 1
    total = int(str(printed).split(" and ")[which])
    return total // int(str(steps).split(" and ")[which]), total


def bert_model(row: dict[str, Any]) -> tuple[Model | None, str]:
    """BERT-large as the row's DeepLearningExamples script trains it, or None and why not:
    SQuAD fine-tuning with its span head at length 384, pre-training with the masked-LM head
    on the masked positions only."""
    # modeling.py @729963dd4 BertSelfAttention.forward: attention_scores / math.sqrt(
    # attention_head_size), then + attention_mask, before the softmax
    cfg = TRANSFORMERS["bert-large"].model_copy(update={"scale_and_mask": True})
    if "squad" in row["id"]:
        return build_transformer(cfg.model_copy(update={"head": "span"}), SQUAD_SEQ_LEN), ""
    seq = int(row["model"]["seq_len"])
    if seq == 512:
        return None, PHASE2_BINNED
    dense = cfg.model_copy(update={"predicted_positions": MAX_PREDICTIONS[seq]})
    return build_transformer(dense, seq), ""


def _case(row: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """gpusim arguments for a row, or None and why it is skipped."""
    gpu = next((v for k, v in GPUS.items() if k in row["hardware"]), None)
    model = row["model"]["name"]
    par = row["parallelism"]
    if gpu is None:
        return None, f"no profile mapping for {row['hardware']}"
    if model == "BERT-large":
        batches, (bert, why) = bert_batches(row), bert_model(row)
        if batches is None:
            return None, "batch per GPU not stated"
        if bert is None:
            return None, why
        micro, total = batches
        precision = PRECISIONS[par["precision"]]
        args = {"gpu": gpu, "precision": precision, "loader_workers": 0, "model": bert,
                "batch_size": total, "grad_accum": total // micro,
                "fp16_weights": precision == "fp16"}
        if "squad" in row["id"]:
            args["stack"] = SQUAD_STACKS[precision == "fp16"]
        return args, ""
    if par.get("batch_per_gpu") is None:
        return None, "batch per GPU not stated unambiguously"
    args: dict[str, Any] = {"gpu": gpu, "precision": PRECISIONS[par["precision"]],
                            "loader_workers": 0}
    micro = int(par["batch_per_gpu"])
    if model.startswith("ResNet-50"):
        # DLE's AMP recipes train channels-last (--memory-format nhwc), the others NCHW.
        args.update(model="resnet50", batch_size=micro,
                    channels_last=str(par.get("memory_format") or "").startswith("nhwc"))
    elif model == "Transformer-XL base (WT103)":
        # README "Training performance benchmark" @729963dd4: run_wt103_base.sh train <GPUs>
        # --config trainbench --local_batch_size <LBS> [--fp16]: batch_chunk 1 (no
        # accumulation); --fp16 is apex amp O2 (train.py: --amp apex, --apex_amp_opt_level
        # O2), fp16 weights with fp32 master copies. jitlamb is costed as Adam (two states),
        # run tensor by tensor as TXL_STACK says. Samples are segments of tgt_len tokens;
        # main() reports tokens/s.
        args.update(model=build_transformer_xl(TRANSFORMER_XLS["transformer-xl-base"]),
                    batch_size=micro, fp16_weights=args["precision"] == "fp16",
                    stack=TXL_STACK)
    else:
        return None, f"{model} is not in the zoo"
    return args, ""


def _samples_per_s(args: dict[str, Any]) -> float:
    """Predicted throughput. BERT in fp16 runs with fp16 weights and fp32 master copies, as
    DeepLearningExamples' scripts run it: pre-training calls model.half() under
    --allreduce_post_accumulation_fp16 (on in scripts/run_pretraining.sh, which launches
    even one GPU through torch.distributed), SQuAD uses apex amp O2 (run_squad.py)."""
    args = dict(args)
    if not args.pop("fp16_weights", False):
        return estimate(**args, steps=1).step.samples_per_s
    job = replace(build_job(**args)[0], master_weights=True)
    return simulate_step(job).samples_per_s


def predicted_value(args: dict[str, Any], row: dict[str, Any]) -> float:
    """A row's prediction in the row's own unit (Transformer-XL: tokens, a sample being a
    segment of them)."""
    predicted = _samples_per_s(args)
    if str(row["unit"]).startswith("tokens"):
        predicted *= args["model"].tokens_per_sample
    return predicted


def main(path: Path = DEFAULT) -> None:
    if not path.is_file():
        sys.exit(f"dev_cases.yaml not found at {path}; pass its path")
    rows = [r for r in yaml.safe_load(path.read_text())["B_single_node"] if r["num_gpus"] == 1]
    errors = []
    print(f"{'case':50s} {'gpu':16s} {'pred':>9s} {'meas':>9s} {'error':>8s}  unit")
    for row in rows:
        args, why = _case(row)
        if args is None:
            print(f"{row['id']:50s} skipped: {why}")
            continue
        try:
            predicted = predicted_value(args, row)
        except GpusimError as exc:
            print(f"{row['id']:50s} {args['gpu']:16s} infeasible: {exc}")
            continue
        error = (predicted - row["value"]) / row["value"]
        errors.append(abs(error))
        print(f"{row['id']:50s} {args['gpu']:16s} {predicted:9.1f} {row['value']:9.1f} "
              f"{100 * error:+7.1f}%  {row['unit']}")
    if errors:
        print(f"\n{len(errors)} cases: MAPE {100 * statistics.mean(errors):.1f}%, "
              f"max {100 * max(errors):.1f}%")
    used = sorted({f"{g}: {calibration_for(load_gpu(g)).name}" for g in GPUS.values()})
    print("Input pipeline not simulated (DeepLearningExamples decodes with DALI). "
          f"Calibrations: {'; '.join(used)}.")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
