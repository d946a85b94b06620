"""Files that travel with the weights: generation config, every tokenizer file, license files,
and the SkipV1 modeling code that `auto_map` points at."""

import shutil
from pathlib import Path

from ..errors import SkipV1Error
from ..families import Family

MODELING_DIR = Path(__file__).resolve().parent.parent / "modeling"
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
}
TOKENIZER_DIRS = ("additional_chat_templates",)
OTHER_FILES = ("generation_config.json",)
LICENSE_PREFIXES = ("LICENSE", "LICENCE", "NOTICE", "USE_POLICY")


def is_tokenizer_file(name: str) -> bool:
    return name in TOKENIZER_FILES or name.startswith("tokenizer") or name.endswith(".tiktoken")


def companion_files(src: Path) -> dict[str, list[str]]:
    """The files and folders to copy, by kind, checked now to be readable: a tokenizer file
    that cannot be read fails the conversion before anything is written."""
    found: dict[str, list[str]] = {"tokenizer": [], "other": []}
    for path in sorted(src.iterdir()):
        name = path.name
        if is_tokenizer_file(name) or (name in TOKENIZER_DIRS and path.is_dir()):
            kind = "tokenizer"
        elif name in OTHER_FILES or name.upper().startswith(LICENSE_PREFIXES):
            kind = "other"
        else:
            continue
        _check_readable(path, kind)
        found[kind].append(name)
    return found


def _check_readable(path: Path, kind: str) -> None:
    try:
        if path.is_dir():
            for child in path.rglob("*"):
                if not child.is_dir():
                    child.open("rb").close()
        else:
            path.open("rb").close()
    except OSError as err:
        raise SkipV1Error(
            f"{kind} file {path} cannot be read ({err.strerror or err}): the converted model "
            "would lack it; fix or re-download the source"
        ) from None


def copy_companions(src: Path, out: Path, found: dict[str, list[str]]) -> None:
    for name in found["tokenizer"] + found["other"]:
        source = src / name
        try:
            if source.is_dir():
                shutil.copytree(source, out / name)
            else:
                shutil.copyfile(source, out / name)
        except OSError as err:
            raise SkipV1Error(
                f"could not copy {source} ({err.strerror or err}): fix or re-download the source"
            ) from None


def copy_modeling_code(out: Path, family: Family) -> None:
    """The family's modeling files (`Family.modeling_files`), which `auto_map` points at."""
    for name in family.modeling_files:
        shutil.copyfile(MODELING_DIR / name, out / name)
