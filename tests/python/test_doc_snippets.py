"""Every code block of the README and docs/ is checked, so a snippet cannot rot:
Python blocks run (one process each, a 1-rank gloo job around them, with a
small model, loader and sampler for the names they take from a training
script), shell blocks are syntax-checked and every command they name must
exist (files, `rankscope` subcommands, torchrun flags, Python scripts and the
options their --help lists), JSON blocks parse, CMake blocks are what the
install/consumer test builds. C++ blocks are compiled by the build
(tests/docs/snippets.py, target rankscope_doc_snippets)."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, reserved_port

sys.path.insert(0, os.path.join(ROOT, "tests", "docs"))
import snippets  # noqa: E402

BLOCKS = snippets.blocks()
BIN = os.path.dirname(sys.executable)

# Names a training script has before the snippet's lines. The process group is
# created here only when the snippet does not create it itself.
PRELUDE = """
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rankscope
torch.manual_seed(0)
model = nn.Linear(8, 1)
loss_fn = nn.MSELoss()
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=1, rank=0)
loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler)
lr, epoch, world, path, dt = 0.1, 0, 1, "/ckpt/step-10", 2.5
scaler = torch.amp.GradScaler("cpu")
opt = torch.optim.SGD(model.parameters(), lr=lr)
x0, y0 = next(iter(loader))  # an AMP step in progress: the snippet's update() follows scaler.step()
scaler.scale(loss_fn(model(x0), y0)).backward()
scaler.step(opt)
batches = rankscope.BatchAccounting(dataset_size=64, micro_batch=16, data_parallel=1)
"""
# What a script using a framework has before a snippet that shows its integration: tiny models
# from a config, a few steps on the CPU (the frameworks: requirements/frameworks.txt).
FRAMEWORKS = {
    "rankscope.integrations.transformers": """
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}
ds = train = val = _Tokens()
args = TrainingArguments(output_dir="out", max_steps=3, per_device_train_batch_size=4, report_to=[], use_cpu=True,
                         disable_tqdm=True, save_strategy="no")
""",
    "rankscope.integrations.lightning": """
import lightning.pytorch as L
class _Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        return loss_fn(self.net(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
    def train_dataloader(self):
        return loader
model = _Module()
""",
    "accelerator.prepare": """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
""",
}
SETUP_PG = """
rankscope.init()
dist.init_process_group("gloo")
ddp_model = DDP(model)
"""
EPILOGUE = """
rankscope.shutdown()
if dist.is_initialized():
    dist.destroy_process_group()
print("snippet ok")
"""


def ids(lang):
    return [(p, n, c) for p, n, l, c in BLOCKS if l == lang]


def name(b):
    return f"{b[0]}:{b[1]}"


def test_every_block_has_a_checker():
    checked = {"cpp", "python", "sh", "json", "cmake", ""}  # "": shown output, not code
    unknown = [f"{p}:{n} ({l})" for p, n, l, _ in BLOCKS if l not in checked]
    assert not unknown, f"code blocks in a language nothing checks: {unknown}"
    assert len(ids("python")) >= 3 and len(ids("cpp")) >= 6


@pytest.mark.parametrize("block", ids("python"), ids=name)
def test_python_block_runs(block, tmp_path):
    path, line, code = block
    src = PRELUDE
    if "init_process_group" not in code:
        src += SETUP_PG
    for marker, prelude in FRAMEWORKS.items():  # after the process group: the frameworks find it
        if marker in code:
            pytest.importorskip(marker.split(".")[-1] if marker.startswith("rankscope") else "accelerate")
            src += prelude
    src += f"# --- {path}:{line}\n" + code + EPILOGUE
    with reserved_port() as port:
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANKSCOPE_DIR=str(tmp_path / "run"))
        p = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert p.returncode == 0 and "snippet ok" in p.stdout, \
        f"{path}:{line} failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"


def _commands(code):
    """The block's command lines, comments and continuation joined."""
    text = code.replace("\\\n", " ")
    for raw in text.splitlines():
        words = shlex.split(raw, comments=True)
        if words:
            yield raw, words


def _check_command(words, where):
    env = [w for w in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)]
    words = words[len(env):] if words[:len(env)] == env else words
    words = words[1:] if words[0] == "sudo" else words
    cmd, args = words[0], words[1:]
    if cmd == "apt-get" and args[:1] == ["install"]:  # what the docs ask for is what .ci/setup.sh installs
        setup = open(os.path.join(ROOT, ".ci", "setup.sh")).read()
        block = setup[setup.index("PACKAGES=(") + len("PACKAGES=("):setup.index("\n)\n")]
        packages = {p for line in block.splitlines() for p in line.split("#")[0].split()}
        for a in args[1:]:
            assert a.startswith("-") or a in packages, f"{where}: {a} is not among .ci/setup.sh's packages"
    elif cmd == "bash" or cmd.endswith(".sh") or cmd.startswith("build/"):
        script = args[0] if cmd == "bash" else cmd
        if script.startswith("build/"):
            return  # made by the build the block itself starts with
        assert os.path.isfile(os.path.join(ROOT, script)), f"{where}: no such script {script}"
        subprocess.run(["bash", "-n", os.path.join(ROOT, script)], check=True)
    elif cmd == "pip":
        for i, a in enumerate(args):
            if a == "-r":
                assert os.path.isfile(os.path.join(ROOT, args[i + 1])), f"{where}: no such file {args[i + 1]}"
        assert args[0] in ("install", "wheel"), f"{where}: pip {args[0]}?"
    elif cmd == "rankscope" and args[:2] == ["run", "--"]:  # a launcher prefix: the command it runs is checked
        p = subprocess.run([os.path.join(BIN, "rankscope"), "run", "--help"], capture_output=True, text=True)
        assert p.returncode == 0, f"{where}: `rankscope run` is not a command:\n{p.stdout}{p.stderr}"
        _check_command(args[2:], where)
    elif cmd == "rankscope":
        sub = args[0]
        p = subprocess.run([os.path.join(BIN, "rankscope"), sub, "--help"], capture_output=True, text=True)
        assert p.returncode == 0, f"{where}: `rankscope {sub}` is not a command:\n{p.stdout}{p.stderr}"
        for a in args[1:]:
            if a.startswith("-"):
                assert a.split("=")[0] in p.stdout, f"{where}: `rankscope {sub}` has no option {a}"
    elif os.path.basename(cmd) in ("python", "python3") and args and args[0].endswith(".py"):
        script = os.path.join(ROOT, args[0])
        assert os.path.isfile(script), f"{where}: no such script {args[0]}"
        p = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{where}: `{args[0]} --help` failed:\n{p.stdout}{p.stderr}"
        for a in args[1:]:
            if a.startswith("--"):
                assert a.split("=")[0] in p.stdout, f"{where}: {args[0]} has no option {a}"
    elif cmd == "torchrun":
        p = subprocess.run([os.path.join(BIN, "torchrun"), "--help"], capture_output=True, text=True)
        assert p.returncode == 0
        # torchrun's options, then the script and its own options.
        script_at = next((i for i, a in enumerate(args) if a.endswith(".py")), len(args))
        for a in args[:script_at]:
            if a.startswith("--"):
                assert a.split("=")[0] in p.stdout.replace("_", "-"), f"{where}: torchrun has no option {a}"
        if script_at < len(args) and "/" in args[script_at]:  # a bare train.py is the user's own
            _check_command(["python", *args[script_at:]], where)
    else:
        pytest.fail(f"{where}: a command the doc test does not know: {' '.join(words)}")


@pytest.mark.parametrize("block", ids("sh"), ids=name)
def test_shell_block_names_real_commands(block):
    path, line, code = block
    subprocess.run(["bash", "-n"], input=code, text=True, check=True)
    for raw, words in _commands(code):
        _check_command(words, f"{path}:{line}: {raw.strip()}")


@pytest.mark.parametrize("block", ids("json"), ids=name)
def test_json_block_parses(block):
    path, line, code = block
    for i, text in enumerate(code.splitlines()):
        if text.strip():
            try:
                json.loads(text)
            except ValueError as e:
                pytest.fail(f"{path}:{line + i}: not JSON: {e}")


@pytest.mark.parametrize("block", ids("cmake"), ids=name)
def test_cmake_block_is_what_the_consumer_test_builds(block):
    path, line, code = block
    with open(os.path.join(ROOT, "tests", "consumer", "CMakeLists.txt")) as f:
        consumer = [l.split("#")[0].strip() for l in f]
    for text in code.splitlines():
        stmt = text.split("#")[0].strip().replace("(trainer ", "(consumer ")
        if stmt:
            assert stmt in consumer, f"{path}:{line}: `{stmt}` is not in tests/consumer/CMakeLists.txt"


def test_cross_references_in_code_point_at_places_that_exist():
    """A comment naming a docs/<page>.md, a benchmarks/ or tests/ file, or a quoted
    section of the README must name something that exists."""
    ref = re.compile(r"\b((?:docs|benchmarks|tests|examples)/[A-Za-z0-9_./-]+\.(?:md|sh|py|cpp|hpp))")
    section = re.compile(r'README[,:]? \(?"([^"]+)"')
    readme = open(os.path.join(ROOT, "README.md")).read()
    bad = []
    for top in ("include", "lib", "bindings", "examples", "benchmarks", "tests"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith((".cpp", ".hpp", ".h", ".py", ".sh", ".c")):
                    continue
                path = os.path.join(dirpath, f)
                text = open(path, encoding="utf-8", errors="replace").read()
                for m in ref.finditer(text):
                    if not os.path.exists(os.path.join(ROOT, m.group(1))):
                        bad.append(f"{os.path.relpath(path, ROOT)}: {m.group(1)}")
                for m in section.finditer(text):
                    if m.group(1) not in readme:
                        bad.append(f"{os.path.relpath(path, ROOT)}: README section {m.group(1)!r}")
    assert not bad, "references to places that do not exist:\n" + "\n".join(bad)
