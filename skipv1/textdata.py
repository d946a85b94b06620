"""Text sources shared by `eval`, `uptrain` and calibration, all read through `datasets`.

A data spec is a string or a mapping:
- a local file, directory or glob: `.txt` (one document per file), `.jsonl`/`.json` or `.parquet`
  (one document per record);
- `embedded`, `embedded:train` or `embedded:validation`: the English documentation prose that
  ships with CPython (`pydoc_data.topics`), usable offline, cut into ~2,000-character documents
  of whole paragraphs; validation is every tenth document;
- a Hub dataset `NAME[:CONFIG][@SPLIT]` (needs network access);
- a mapping `{files | name, config, split, text_field, streaming}` as used in recipes.
"""

import contextlib
import glob
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SkipV1Error

FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
}
EMBEDDED_SPLITS = ("all", "train", "validation")


@dataclass
class DataStats:
    documents: int = 0
    tokens: int = 0
    skipped_records: int = 0  # missing / empty / non-string text
    skipped_files: list[str] = field(default_factory=list)  # zero-byte files

    def warn(self, what: str) -> None:
        if self.skipped_files:
            warnings.warn(
                f"{what}: skipped {len(self.skipped_files)} empty file(s), e.g. "
                f"{self.skipped_files[0]}",
                stacklevel=2,
            )
        if self.skipped_records:
            warnings.warn(
                f"{what}: skipped {self.skipped_records} record(s) with a missing, empty or "
                "non-string text field",
                stacklevel=2,
            )

    def no_block(self, what: str, spec: "DataSpec", seq_len: int) -> SkipV1Error:
        """The error for data that does not fill one block."""
        skipped = (
            f"; {self.skipped_records} record(s) skipped: missing, empty or non-string text"
            if self.skipped_records
            else ""
        )
        return SkipV1Error(
            f"{what} data {spec.describe()} holds no block of data.seq_len={seq_len} tokens "
            f"({self.documents} usable documents{skipped}): add data or lower data.seq_len"
        )


@dataclass(frozen=True)
class DataSpec:
    kind: str  # "files" | "hub" | "embedded"
    files: tuple[str, ...] = ()
    name: str | None = None
    config: str | None = None
    split: str = "train"
    text_field: str = "text"

    def describe(self) -> str:
        if self.kind == "files":
            return ", ".join(self.files[:3]) + (" ..." if len(self.files) > 3 else "")
        if self.kind == "embedded":
            return f"embedded CPython docs ({self.split})"
        return f"{self.name}{':' + self.config if self.config else ''}@{self.split}"


def parse_data_spec(spec: "str | dict[str, Any] | DataSpec") -> DataSpec:
    if isinstance(spec, DataSpec):
        return spec
    if isinstance(spec, dict):
        return _spec_from_mapping(spec)
    text = str(spec).strip()
    if not text:
        raise SkipV1Error("empty data spec: give a file, a glob, `embedded` or a Hub dataset name")
    if text == "embedded" or text.startswith("embedded:"):
        split = text.partition(":")[2] or "all"
        if split not in EMBEDDED_SPLITS:
            raise SkipV1Error(f"unknown embedded split {split!r}: use one of {EMBEDDED_SPLITS}")
        return DataSpec(kind="embedded", split=split)
    if _looks_local(text):
        return DataSpec(kind="files", files=_expand_files(text))
    name, _, split = text.partition("@")
    name, _, config = name.partition(":")
    return DataSpec(kind="hub", name=name, config=config or None, split=split or "train")


def _spec_from_mapping(spec: dict) -> DataSpec:
    allowed = {"files", "name", "config", "split", "text_field"}
    unknown = set(spec) - allowed
    if unknown:
        raise SkipV1Error(
            f"unknown data key(s) {sorted(unknown)}: allowed keys are {sorted(allowed)}"
        )
    text_field = spec.get("text_field", "text")
    if spec.get("files"):
        files = spec["files"] if isinstance(spec["files"], list) else [spec["files"]]
        expanded = tuple(f for pattern in files for f in _expand_files(str(pattern)))
        return DataSpec(kind="files", files=expanded, text_field=text_field)
    if spec.get("name"):
        base = parse_data_spec(spec["name"])
        if base.kind != "hub":
            return DataSpec(
                kind=base.kind,
                files=base.files,
                split=spec.get("split", base.split),
                text_field=text_field,
            )
        return DataSpec(
            kind="hub",
            name=base.name,
            config=spec.get("config", base.config),
            split=spec.get("split", base.split),
            text_field=text_field,
        )
    raise SkipV1Error(
        "a data source needs `files` (local paths or globs) or `name` (a Hub dataset)"
    )


def _looks_local(text: str) -> bool:
    return (
        any(c in text for c in "*?[")
        or os.path.exists(text)
        or text.startswith((".", "/", "~"))
        or Path(text).suffix.lower() in FORMATS
    )


def _expand_files(pattern: str) -> tuple[str, ...]:
    pattern = os.path.expanduser(pattern)
    if os.path.isdir(pattern):
        paths = sorted(
            p
            for p in glob.glob(os.path.join(pattern, "**", "*"), recursive=True)
            if Path(p).suffix.lower() in FORMATS
        )
    else:
        paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise SkipV1Error(f"no data files match {pattern!r}: check the path or glob")
    formats = {FORMATS.get(Path(p).suffix.lower()) for p in paths}
    if None in formats or len(formats) > 1:
        raise SkipV1Error(
            f"data files {pattern!r} must all be one of the formats {sorted(set(FORMATS))} "
            "(.txt, .jsonl/.json or .parquet)"
        )
    return tuple(paths)


def embedded_documents(split: str = "all") -> list[str]:
    """CPython's pydoc topics as ~2,000-character documents in a fixed order; every 10th is
    validation, so both splits cover all topics."""
    from pydoc_data.topics import topics

    docs, current = [], ""
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            current = f"{current}\n\n{paragraph}" if current else paragraph
            if len(current) >= 2000:
                docs.append(current.strip())
                current = ""
    if current.strip():
        docs.append(current.strip())
    if split == "train":
        return [d for i, d in enumerate(docs) if i % 10 != 9]
    if split == "validation":
        return [d for i, d in enumerate(docs) if i % 10 == 9]
    return docs


def open_dataset(spec: "str | dict | DataSpec", streaming: bool = False):
    """A `datasets` Dataset (or IterableDataset when streaming) with a `text_field` column."""
    import datasets

    spec = parse_data_spec(spec)
    if spec.kind == "embedded":
        ds = datasets.Dataset.from_dict({"text": embedded_documents(spec.split)})
        return ds.to_iterable_dataset() if streaming else ds
    try:
        if spec.kind == "files":
            builder = FORMATS[Path(spec.files[0]).suffix.lower()]
            kwargs = {"sample_by": "document"} if builder == "text" else {}
            return datasets.load_dataset(
                builder, data_files=list(spec.files), split="train", streaming=streaming, **kwargs
            )
        return datasets.load_dataset(spec.name, spec.config, split=spec.split, streaming=streaming)
    except SkipV1Error:
        raise
    except Exception as err:
        raise read_error(spec, err) from err


def read_error(spec: DataSpec, err: Exception) -> SkipV1Error:
    """datasets raises many types, some saying only "An error occurred while generating the
    dataset": the user needs the spec and the cause, for JSON files the file and line."""
    if spec.kind == "files" and FORMATS[Path(spec.files[0]).suffix.lower()] == "json":
        explained = _explain_json_error(spec)
        if explained:
            return SkipV1Error(explained)
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return SkipV1Error(f"cannot read data {spec.describe()}: {first_line}")


def _explain_json_error(spec: DataSpec) -> str | None:
    """datasets says only "An error occurred while generating the dataset" (or raises a bare
    StopIteration when there is nothing to read): find the file and line (after a failure)."""
    import json

    empty = 0
    for name in spec.files:
        try:
            text = Path(name).read_bytes().decode("utf-8")
        except OSError:
            return None
        except UnicodeDecodeError as bad:  # what pyarrow reports as a parse error
            return _not_utf8(name, bad)
        if not text.strip():
            empty += 1
            continue
        try:
            json.loads(text)  # one JSON document (an array of records)
            continue
        except json.JSONDecodeError:
            pass
        for number, line in enumerate(text.splitlines(), 1):  # JSON Lines
            try:
                line.strip() and json.loads(line)
            except json.JSONDecodeError as bad:
                return (
                    f"data file {name} line {number} is not JSON ({bad.msg}, column {bad.colno}): "
                    "fix or remove that line (one JSON object per line, or one JSON array)"
                )
    return _no_records(spec) if empty == len(spec.files) else None


def _no_records(spec: DataSpec) -> str:
    return f"data {spec.describe()} holds no records: give files with text"


def iter_documents(
    spec: "str | dict | DataSpec",
    streaming: bool = False,
    stats: DataStats | None = None,
    shuffle: tuple[int, int] | None = None,
) -> Iterator[str]:
    """The non-empty texts of a data source in a fixed order; `shuffle` = (seed, buffer) for
    streaming. Records whose text is missing, empty or not a string are skipped and counted in
    `stats`; a text field the data lacks and undecodable files are errors naming them."""
    spec = parse_data_spec(spec)
    stats = DataStats() if stats is None else stats
    with undecodable_file_named(spec):
        ds, field_name = open_text_dataset(spec, streaming)
        if shuffle is not None and shuffle[1] > 0:
            ds = ds.shuffle(seed=shuffle[0], buffer_size=shuffle[1])
        for index, record in enumerate(_records(ds, spec)):
            if index == 0 and field_name not in record:  # streamed: no columns to check up front
                raise _no_text_field(spec, field_name, record)
            text = record.get(field_name)
            if not is_document(text):
                stats.skipped_records += 1
                continue
            stats.documents += 1
            yield text


def _records(ds, spec: DataSpec) -> Iterator[dict]:
    """The dataset's records; streamed data is read (and fails) only here, so datasets' errors
    are named here as open_dataset names them."""
    records = iter(ds)
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except (SkipV1Error, UnicodeDecodeError):
            raise
        except Exception as err:
            raise read_error(spec, err) from err
        yield record


def is_document(text) -> bool:
    """Whether a record's text is used: a string with something besides white space."""
    return isinstance(text, str) and bool(text.strip())


def open_text_dataset(spec: DataSpec, streaming: bool = False):
    """(dataset, text field name), erroring if the dataset's columns lack the text field."""
    field_name = "text" if spec.kind == "embedded" else spec.text_field
    ds = open_dataset(spec, streaming=streaming)
    columns = getattr(ds, "column_names", None)
    if columns == []:  # JSON files of blank lines load as records of no fields
        raise SkipV1Error(_no_records(spec))
    if columns is not None and field_name not in columns:
        raise _no_text_field(spec, field_name, columns)
    return ds, field_name


def _no_text_field(spec: DataSpec, field_name: str, columns) -> SkipV1Error:
    return SkipV1Error(
        f"data {spec.describe()} has no text field {field_name!r}: set `text_field` to one of "
        f"{sorted(columns)} (give the data as a mapping, e.g. "
        f"`{{files: {spec.describe()}, text_field: {sorted(columns)[0]}}}`)"
    )


@contextlib.contextmanager
def undecodable_file_named(spec: DataSpec):
    """Turns a UTF-8 decoding failure anywhere in reading `spec` into an error naming the file."""
    try:
        yield
    except SkipV1Error as err:
        raise _explain_decode_error(spec, err) from err.__cause__
    except UnicodeDecodeError as err:
        raise _explain_decode_error(spec, err) from err


def _explain_decode_error(spec: DataSpec, err: Exception) -> Exception:
    """datasets hides which file held undecodable bytes; find it (only after a failure)."""
    cause, chain = err, []
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(c, UnicodeDecodeError) for c in chain) or spec.kind != "files":
        return err
    for name in spec.files:
        try:
            Path(name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as bad:
            return SkipV1Error(_not_utf8(name, bad))
    return err


def _not_utf8(name: str, bad: UnicodeDecodeError) -> str:
    return (
        f"data file {name} is not valid UTF-8 (byte {bad.object[bad.start]:#04x} at offset "
        f"{bad.start}): re-encode it as UTF-8 or remove it from the data"
    )
