"""`python -m trainer.export_hf runs/<name> --out hf/<name>`: a cramnas checkpoint as a transformers model.

The export directory loads with transformers alone, no cramnas installed:

    AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True)
    AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True, num_labels=2)
    AutoTokenizer.from_pretrained(out)                     # the same ids as cramnas's tokenizer

It holds config.json, model.safetensors, the tokenizer files and the remote code: the modules of
`trainer/hf_remote/` and every cramnas module they import (`trainer/model.py`, `space/arch.py`, ...),
copied with those imports made relative (`remote_code`), so the model is never written twice. An
original-BERT architecture (`trainer.hf_compat.is_original_bert`) becomes a plain `BertForMaskedLM`
that needs no remote code.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from space.errors import CramnasError
from trainer.checkpoint import load_checkpoint
from trainer.config import ConfigError
from trainer.console import CliParser, one_line_on_ctrl_c
from trainer.hf_compat import is_original_bert, to_hf_bert
from trainer.model import CrammedBert
from trainer.tokenizer import SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[1]
CRAMNAS_PACKAGES = ("space", "trainer", "glue", "search", "dashboards")
REMOTE_PACKAGE = "trainer.hf_remote"
# What transformers' Auto classes build from an export (config.json's auto_map).
AUTO_MAP = {
    "AutoConfig": "configuration_crammed_bert.CrammedBertConfig",
    "AutoModel": "modeling_crammed_bert.CrammedBertModel",
    "AutoModelForMaskedLM": "modeling_crammed_bert.CrammedBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_crammed_bert.CrammedBertForSequenceClassification",
}


HF_ARTIFACT = "hf_model"  # the export's folder among an MLflow run's artifacts


class HfExportError(CramnasError):
    """A run directory or --out that cannot be exported: one line naming the problem and the fix."""


def exported_name(module: str) -> str:
    """A cramnas module's name in an export: trainer/hf_remote's keep theirs (auto_map names them),
    the others are flattened (`trainer.model` -> `trainer_model`)."""
    package, _, name = module.rpartition(".")
    return name if package == REMOTE_PACKAGE else module.replace(".", "_")


def remote_code() -> dict[str, str]:
    """File name -> source of the export's remote code: the modules of auto_map and every cramnas
    module they import, transitively, each `from <cramnas module> import` made relative."""
    pending = sorted({f"{REMOTE_PACKAGE}.{target.split('.')[0]}" for target in AUTO_MAP.values()})
    sources: dict[str, str] = {}
    while pending:
        module = pending.pop()
        file_name = f"{exported_name(module)}.py"
        if file_name in sources:
            continue
        path = ROOT / f"{module.replace('.', '/')}.py"
        source = path.read_text()
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in CRAMNAS_PACKAGES for a in node.names):
                raise RuntimeError(f"{path}:{node.lineno}: write `from <module> import ...` so the export can copy it")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in CRAMNAS_PACKAGES:
                line = lines[node.lineno - 1]
                relative = line.replace(f"from {node.module} import", f"from .{exported_name(node.module)} import", 1)
                if relative == line:
                    raise RuntimeError(f"{path}:{node.lineno}: keep `from {node.module} import` on one line")
                lines[node.lineno - 1] = relative
                pending.append(node.module)
        sources[file_name] = "".join(lines)
    return sources


def save_tokenizer(tokenizer_path: Path, out: Path, max_length: int) -> Tokenizer:
    """tokenizer.json as cramnas trained it, with tokenizer_config.json naming its special tokens."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    missing = [token for token in SPECIAL_TOKENS.values() if tokenizer.token_to_id(token) is None]
    if missing:
        raise HfExportError(f"tokenizer: {tokenizer_path} lacks {', '.join(missing)}; restore the tokenizer.json "
                            "the checkpoint was trained with")
    # Segment ids too: cramnas encodes sentence pairs with them (the model ignores them without segment embeddings).
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"],
                                   **{f"{name}_token": token for name, token in SPECIAL_TOKENS.items()})
    fast.save_pretrained(out)
    return tokenizer


def save_model(model: CrammedBert, out: Path, pad_token_id: int) -> None:
    """config.json and model.safetensors (plus the remote code unless it is the original BERT)."""
    if is_original_bert(model.arch):
        hf = to_hf_bert(model)
        hf.config.pad_token_id = pad_token_id
        hf.save_pretrained(out)
        return
    from trainer.hf_remote.configuration_crammed_bert import CrammedBertConfig
    from trainer.hf_remote.modeling_crammed_bert import CrammedBertForMaskedLM

    config = CrammedBertConfig(**model.arch.to_dict(), pad_token_id=pad_token_id)
    config.auto_map = AUTO_MAP
    config.architectures = [CrammedBertForMaskedLM.__name__]
    hf = CrammedBertForMaskedLM(config)
    hf.crammed.load_state_dict(model.state_dict(), strict=True)
    hf.save_pretrained(out)
    for file_name, source in remote_code().items():
        (out / file_name).write_text(source)


def check_out(out: Path, force: bool) -> None:
    """--out must be new or empty; --force replaces an earlier export (a directory with config.json)."""
    if out.exists() and not out.is_dir():
        raise HfExportError(f"--out: {out} is a file; choose a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise HfExportError(f"--out: {out} is not empty; pass --force to replace it, or choose a new directory")
    if not (out / "config.json").is_file():
        raise HfExportError(f"--out: {out} is not empty and holds no earlier export (no config.json), so --force "
                            "will not replace it; choose a new directory")


def export(run_dir: str | Path, out: str | Path, force: bool = False) -> Path:
    """Write the transformers export of checkpoint `run_dir` to `out`; returns `out`.

    The files are written to a temporary directory beside `out` that replaces it at the end, so
    `out` holds a complete export or what it held before.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.is_dir():
        raise HfExportError(f"run directory {run_dir}: no such directory; pass a checkpoint directory written by "
                            "trainer.cram (runs/<name>) or search.run --save-checkpoints")
    check_out(out, force)
    try:
        model, tokenizer_path = load_checkpoint(run_dir)
    except ConfigError as error:
        raise HfExportError(str(error)) from None
    staging = out.parent / f".{out.name}.export-{os.getpid()}"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        tokenizer = save_tokenizer(tokenizer_path, staging, model.arch.max_seq_len)
        save_model(model, staging, pad_token_id=tokenizer.token_to_id(SPECIAL_TOKENS["pad"]))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except OSError as error:
        raise HfExportError(f"--out: cannot write {out} ({error.strerror or error}); choose a writable directory "
                            "with free space") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def log_to_mlflow(client, run_id: str, checkpoint: str | Path) -> str:
    """Export `checkpoint` into the `hf_model/` artifact of MLflow run `run_id` (`client`: an
    MlflowClient); returns the artifact's URI, which `mlflow.artifacts.download_artifacts` fetches."""
    with tempfile.TemporaryDirectory() as tmp:
        out = export(checkpoint, Path(tmp) / HF_ARTIFACT)
        client.log_artifacts(run_id, str(out), HF_ARTIFACT)
    return f"{client.get_run(run_id).info.artifact_uri}/{HF_ARTIFACT}"


def build_parser() -> CliParser:
    """The command line of `python -m trainer.export_hf` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m trainer.export_hf",
                                     description="Export a cramnas checkpoint as a Hugging Face transformers model.")
    parser.add_argument("run_dir", help="checkpoint directory written by trainer.cram, e.g. runs/<name>")
    parser.add_argument("--out", required=True, help="export directory, e.g. hf/<name>")
    parser.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = export(args.run_dir, args.out, force=args.force)
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    remote = (out / "modeling_crammed_bert.py").is_file()  # else a plain BertForMaskedLM
    print(f"exported {args.run_dir} to {out}; load it with AutoModelForMaskedLM.from_pretrained({str(out)!r}"
          f"{', trust_remote_code=True' if remote else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
