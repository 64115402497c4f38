# SPDX-License-Identifier: MIT
"""torch_offload against the Python tools that offload activations, on the
same model in the same run: no offloading; torch.autograd.graph.save_on_cpu
(pin_memory=True); TRL's OffloadActivations (use_streams True and False);
torchtune's OffloadActivations; ours Blocking and Streamed (and Streamed
with storage="pinned_pool").

    python3 bench/peers.py --device sim|cuda --out DIR [--quick] [--models NAME,...] [--hooks-only]
    python3 bench/peers.py --device sim --plan --out DIR [--quick] [--models NAME,...]

Writes DIR/peers.json (sim) or DIR/peers-cuda.json (cuda), with -quick
before .json for --quick, and prints markdown tables: per (model, layers,
link bandwidth) cell, R (bytes moved per step / bandwidth, over the forward
compute time of no offloading), peak device bytes and median
step time as ratios to no offloading, whether the losses are bitwise those
of no offloading, and host time per saved tensor for pack + unpack (one
extra instrumented step: the tool's pack and unpack hooks timed). The tools
step in turn (round robin), so a change in machine load hits all alike; a
tool's peak is its model and AdamW state plus the most its step added above
what was allocated when the step began; its pinned host peak (sim only) is
the most page-locked host bytes its step held above what was held when the
step began, counted in the sizes requested (sim's host_memory()
peak_bytes), except for our pinned pool, whose column is its reserve (its
slabs stay pinned across steps); its pinned host reserve is what one more
step sets aside in pinned blocks, measured after sim's idle cached blocks
(every tool's) were returned: the blocks as the allocator rounds them,
powers of two with host_power_of_two=True as CUDA's caching host
allocator (the pool: its reserve). Then the hook cost per saved tensor
of the Python route against identity hooks (a CPU tensor passed through,
and a sim tensor offloaded over a free link), and the
correctness matrix (tests/python/cases.py x tool: exact / differs / raises).
On the transformers models three more rows checkpoint every decoder layer:
transformers' own checkpointing (use_reentrant=False) without offloading,
its ``activation_checkpointing_enable(offload=True)`` (a blocking pinned
save_on_cpu around each checkpointed layer; where the installed
transformers has it) and torch_offload.enable_gradient_checkpointing with a
streamed Manager (each layer's input offloaded, copies overlapped,
prefetched ahead of the recomputation).
Peers that cannot be imported are listed with the reason. The models: the
GPT of models/gpt.hpp (tests/python/gpt.py; 4, 8, 16 layers), and
Hugging Face transformers' GPT-2 and Llama built from configs of the same
width, heads, sequence and vocabulary (random init, dropout off; 4 layers,
and 16 without --quick); width 256; AdamW. On sim every tool's copies
cross the same link, latency + bytes / bandwidth per copy (sim's default
latency, 10 us; bandwidth 25 GB/s, sim's default, and 1 GB/s); on cuda
there is no link axis (R from the device's copies is not computed).

--plan (sim; the transformers models, 4 layers, and 16 without --quick):
the automatic plan, torch_offload.enable_gradient_checkpointing(model,
Manager(sync="streamed", device_target_bytes=T), plan="auto"), against no
offloading, transformers' checkpointing and its offload=True, TRL's
OffloadActivations (use_streams=True) and ours checkpoint streamed, at R =
1 and 3. As bench/plan.cpp does in C++: a probe first measures the forward
time of no offloading and the bytes offloading everything (ours streamed)
copies to the host per step, and sim's bandwidth is set to bytes / (R x
forward); T is halfway between the peaks of ours checkpoint streamed and of
no offloading, measured by the same probe. 6 steps per tool (round robin);
a row's peak_bytes is the most its run had allocated at once (its model,
gradients and AdamW state, and its step's tensors) from step 2 on,
median_step_s the median of steps 3 on; meets_target (ours auto only):
peak_bytes <= 1.02 T. Writes DIR/peers-plan.json (-quick before .json).
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

import cases  # noqa: E402
import gpt  # noqa: E402
import hook_overhead  # noqa: E402
import torch_offload  # noqa: E402


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:120]


def make_tools(device):
    """name -> factory(model or None) -> context manager; and name -> why unavailable."""
    tools, missing = {}, {}
    tools["none"] = lambda model: contextlib.nullcontext()
    tools["save_on_cpu"] = lambda model: torch.autograd.graph.save_on_cpu(pin_memory=True)
    try:
        import accelerate
        import trl
        from trl.models.activation_offloading import OffloadActivations as Trl

        # TRL logs through accelerate's logger, which raises without an
        # accelerate state (e.g. when host memory use passes TRL's 60 % mark).
        accelerate.PartialState(cpu=True)

        tools[f"trl {trl.__version__} streams"] = lambda model: Trl(use_streams=True)
        tools[f"trl {trl.__version__} no streams"] = lambda model: Trl(use_streams=False)
    except Exception as e:  # reported in the table
        missing["trl"] = first_line(e)
    try:
        import torchtune
        from torchtune.training import OffloadActivations as Tune

        tools[f"torchtune {torchtune.__version__}"] = lambda model: Tune()
    except Exception as e:
        missing["torchtune"] = first_line(e)

    def ours(sync, **options):
        def make(model):
            manager = torch_offload.Manager(device, sync=sync, **options)
            if model is not None:
                manager.exclude(model.parameters())
            return manager

        return make

    tools["ours blocking"] = ours("blocking")
    tools["ours streamed"] = ours("streamed")
    tools["ours streamed pool"] = ours("streamed", storage="pinned_pool")
    tools["ours streamed, prefetch_depth 1"] = ours("streamed", prefetch_depth=1)  # a smaller backward window
    return tools, missing


def make_checkpoint_tools(device):
    """Checkpointing rows for transformers models: name -> factory(model)
    that turns on the model's checkpointing of every decoder layer and
    returns the context its step runs in; and name -> why unavailable."""
    tools, missing = {}, {}
    try:
        import inspect

        import transformers
    except Exception as e:
        missing["transformers checkpointing"] = first_line(e)
        return tools, missing
    kwargs = {"use_reentrant": False}

    def hf(**more):
        def make(model):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(kwargs), **more)
            return contextlib.nullcontext()

        return make

    tools["hf checkpoint"] = hf()
    enable = getattr(transformers.PreTrainedModel, "activation_checkpointing_enable", None)
    if enable is not None and "offload" in inspect.signature(enable).parameters:
        tools[f"hf checkpoint offload=True ({transformers.__version__})"] = hf(offload=True)
    else:
        missing["hf checkpoint offload=True"] = f"transformers {transformers.__version__} has no offload=True"

    def ours(model):
        torch_offload.enable_gradient_checkpointing(model, torch_offload.Manager(device, sync="streamed"))
        return contextlib.nullcontext()

    tools["ours checkpoint streamed"] = ours
    return tools, missing


def instrument(ctx, counter):
    """Times the context's pack and unpack hooks (saved_tensors_hooks keeps
    them as pack_hook/unpack_hook; torch_offload as _pack/_unpack)."""
    names = ("pack_hook", "unpack_hook") if hasattr(ctx, "pack_hook") else ("_pack", "_unpack")
    for name in names:
        original = getattr(ctx, name)

        def timed(x, original=original, name=name):
            t0 = time.perf_counter_ns()
            out = original(x)
            counter["ns"] += time.perf_counter_ns() - t0
            if name in ("pack_hook", "_pack"):
                counter["packs"] += 1
            return out

        setattr(ctx, name, timed)


# model -> (layer counts, layer counts with --quick)
MODELS = {"gpt": ([4, 8, 16], [4, 8]), "transformers gpt2": ([4, 16], [4]), "transformers llama": ([4, 16], [4])}


def make_model(kind, device, layers, shape):
    """-> (model, loss() running its forward on a fixed batch): the GPT of
    models/gpt.hpp, or transformers' GPT-2 / Llama from a config with the
    same width, heads, sequence and vocabulary (dropout off: every tool sees
    the same run)."""
    m, idx_targets = shape["model"], gpt.batch(device, batch_size=shape["batch"], seq=shape["model"]["seq"])
    if kind == "gpt":
        model = gpt.make(device, layers=layers, **m)
        return model, lambda: model.loss(*idx_targets)
    import transformers

    torch.manual_seed(0)
    common = dict(vocab_size=96, bos_token_id=0, eos_token_id=1)
    if kind == "transformers gpt2":
        config = transformers.GPT2Config(
            n_embd=m["width"],
            n_layer=layers,
            n_head=m["heads"],
            n_positions=m["seq"],
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    else:
        config = transformers.LlamaConfig(
            hidden_size=m["width"],
            intermediate_size=4 * m["width"],
            num_hidden_layers=layers,
            num_attention_heads=m["heads"],
            num_key_value_heads=m["heads"],
            max_position_embeddings=m["seq"],
            **common,
        )
    model = transformers.AutoModelForCausalLM.from_config(config).to(device).train()
    ids = idx_targets[0]
    return model, lambda: model(input_ids=ids, labels=ids).loss


class Run:
    """One tool training its own copy of the model (same seed, same batch)."""

    def __init__(self, device, factory, kind, layers, shape):
        self.model, self.loss = make_model(kind, device, layers, shape)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.device = next(self.model.parameters()).device
        self.ctx = factory(self.model)
        self.losses, self.times, self.forward_times, self.peak, self.counter = [], [], [], 0, None
        self.step_seconds, self.step_peaks = [], []  # every step's (--plan)
        self.host_peak = 0 if device == "sim" else None
        self.host_reserved = None  # pinned host bytes reserved by one step (sim; the reserve step)
        self.plain = isinstance(self.ctx, contextlib.nullcontext)

    def step(self, dm, timed, instrumented, reserve=False):
        """One training step; `timed` counts it, `instrumented` times the
        hooks, `reserve` (sim) measures the pinned host blocks it reserves:
        sim's idle cached blocks (other tools' too) are returned first, so
        what the step sets aside is its own, rounded as the allocator rounds."""
        if reserve and self.host_peak is not None:
            torch_offload.sim.empty_cache()
            reserved_at_start = torch_offload.sim.host_memory()["reserved_bytes"]
            torch_offload.sim.reset_host_peak()
        if instrumented and not isinstance(self.ctx, contextlib.nullcontext):
            self.counter = {"ns": 0, "packs": 0}
            instrument(self.ctx, self.counter)
        dm.synchronize()
        dm.reset_peak_memory_stats()
        at_start = dm.memory_allocated()
        if self.host_peak is not None:
            torch_offload.sim.reset_host_peak()
            host_at_start = torch_offload.sim.host_memory()["current_bytes"]
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        with self.ctx:
            loss = self.loss()
        if self.plain:  # no offloading: its forward compute time (R's denominator)
            dm.synchronize()
            forward = time.perf_counter() - t0
        loss.backward()
        self.opt.step()
        dm.synchronize()
        elapsed = time.perf_counter() - t0
        self.losses.append(loss.detach().cpu().numpy().tobytes().hex())
        # The other tools' models share the device: this run's peak is its
        # own model and optimizer state plus what the step added; in
        # step_peaks with the gradients held when the step began (freed by
        # zero_grad), i.e. the most this run had allocated at once.
        added = dm.max_memory_allocated() - at_start
        self.step_seconds.append(elapsed)
        self.step_peaks.append(self.resident_bytes(grads=True) + added)
        if timed:
            self.times.append(elapsed)
            if self.plain:
                self.forward_times.append(forward)
            self.peak = max(self.peak, self.resident_bytes() + added)
            if self.host_peak is not None:
                host = torch_offload.sim.host_memory()["peak_bytes"] - host_at_start
                self.host_peak = max(self.host_peak, host, self.pool_reserve())
        if reserve and self.host_peak is not None:
            reserved = torch_offload.sim.host_memory()["peak_reserved_bytes"] - reserved_at_start
            self.host_reserved = max(reserved, self.pool_reserve())

    def pool_reserve(self):
        """Our pinned pool's reserve for this tool's device (0 for the other
        tools): its slabs stay pinned across steps (reused), so a step adds
        nothing once they exist, and what it holds is the reserve."""
        if "pinned_pool" not in getattr(self.ctx, "describe", str)():
            return 0
        return torch_offload.pool_stats(str(self.device))["reserved_bytes"]

    def resident_bytes(self, grads=False):
        tensors = list(self.model.parameters()) + [
            t for state in self.opt.state.values() for t in state.values() if torch.is_tensor(t)
        ]
        if grads:
            tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        return sum(t.nbytes for t in tensors if t.device == self.device)

    def bytes_moved(self):
        """Bytes ours copied so far, (offloaded, reloaded) (None for the other tools)."""
        stats = getattr(self.ctx, "stats", None)
        return (stats().bytes_offloaded, stats().bytes_reloaded) if stats else None

    def host_ns_per_saved_tensor(self):
        return self.counter["ns"] / self.counter["packs"] if self.counter and self.counter["packs"] else None


def train_all(device, dm, tools, kind, layers, steps, shape, time_hooks=True):
    """Every tool steps in turn (round robin, so that a change in machine
    load hits all of them alike): step 0 warms up, steps 1..steps are timed
    (median) and give the peak, a last step times the hooks (time_hooks).
    With time_hooks, one more step measures the pinned host bytes each
    tool reserves (Run.step's `reserve`; sim only). Returns name -> row."""
    runs, rows = {}, {}
    for name, factory in tools.items():
        try:
            runs[name] = Run(device, factory, kind, layers, shape)
        except Exception as e:
            rows[name] = {"error": first_line(e)}
    for step in range(steps + (3 if time_hooks else 1)):
        for name, run in list(runs.items()):
            try:
                run.step(dm, timed=1 <= step <= steps, instrumented=step == steps + 1, reserve=step == steps + 2)
            except Exception as e:
                rows[name] = {"error": first_line(e)}
                del runs[name]
    for name, run in runs.items():
        rows[name] = {
            "peak_bytes": run.peak,
            "host_pinned_peak_bytes": run.host_peak,
            "host_pinned_reserved_bytes": run.host_reserved,
            "median_step_s": statistics.median(run.times),
            "losses": run.losses,
            "host_ns_per_saved_tensor": run.host_ns_per_saved_tensor(),
            "step_seconds": run.step_seconds,
            "step_peak_bytes": run.step_peaks,
        }
        if run.forward_times:
            rows[name]["median_forward_s"] = statistics.median(run.forward_times)
        moved = run.bytes_moved()
        if moved is not None:
            rows[name]["bytes_moved_per_step"] = sum(moved) / len(run.step_seconds)
            rows[name]["bytes_offloaded_per_step"] = moved[0] / len(run.step_seconds)
        if hasattr(run.ctx, "plan_row"):
            rows[name].update(run.ctx.plan_row())
    return {name: rows[name] for name in tools}


def matrix_cell(case, factory, device, reference):
    try:
        got = cases.CASES[case](lambda: factory(None), device)
    except Exception as e:
        line = first_line(e)
        if isinstance(reference, str) and line == reference:
            return "exact (raises as without offloading)"
        return f"raises ({line})"
    if isinstance(reference, str):
        return "differs (no error where autograd raises)"
    same = len(got) == len(reference) and all(
        a.device == b.device
        and a.shape == b.shape
        and torch.equal(
            a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
            b.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
        )
        for a, b in zip(reference, got, strict=True)
    )
    return "exact" if same else "differs"


def hook_cost(device, quick):
    """The hook cost per saved tensor of the Python route (prints a table;
    returns name -> row)."""
    # Hook cost: what the Python route adds per saved tensor, measured as
    # bench/hook_overhead.py measures the identity hooks (256 saved
    # float32[16] tensors per run, process CPU time, alternating rounds): CPU
    # tensors (passed through), and tensors of the manager's device that it
    # offloads (min_offload_bytes 0; on sim over a free link: the host cost
    # of the route and the copies' issue, not the link's time).
    warmup, rounds = (5, 100) if quick else (20, 400)
    manager = torch_offload.Manager(device)
    offloading = torch_offload.Manager(device, sync="blocking", min_offload_bytes=0)
    hook_rows = {
        "python identity hooks (floor)": (hook_overhead.identity_hooks, "cpu"),
        "torch_offload.Manager (passed through in C++)": (lambda: manager, "cpu"),
        "torch_offload.no_offload": (torch_offload.no_offload, "cpu"),
        "python identity hooks": (hook_overhead.identity_hooks, device),
        "torch_offload.Manager, sync blocking (offloaded)": (lambda: offloading, device),
    }
    if device == "sim":
        torch_offload.sim.set_copy_latency_us(0)
        torch_offload.sim.set_copy_bandwidth_gbps(10_000)
    print("\n## Hook cost per saved tensor (host CPU time)\n")
    print("| hooks | tensors on | ns per saved tensor (median) | IQR | / identity hooks, same device |")
    print("|---|---|---|---|---|")
    rows = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors, as bench/hook_overhead.py
    # The rows take turns in blocks of rounds, so that a change in machine
    # load hits all of them alike.
    blocks = 4
    samples = {name: [] for name in hook_rows}
    for _ in range(blocks):
        for name, (make_ctx, where) in hook_rows.items():
            samples[name] += hook_overhead.measure(make_ctx, warmup, rounds // blocks, device=where)[0]
    floors = {}
    for name, (_, where) in hook_rows.items():
        median = statistics.median(samples[name])
        q = statistics.quantiles(samples[name], n=4)
        floor = floors.setdefault(where, median)  # each device's identity row comes first
        rows[name] = {
            "ns_per_tensor": median,
            "q1": q[0],
            "q3": q[2],
            "rounds": rounds,
            "device": where,
            "ratio_to_identity": median / floor,
        }
        print(f"| {name} | {where} | {median:.0f} | {q[0]:.0f}..{q[2]:.0f} | {median / floor:.2f} |")
    torch.set_num_threads(threads)
    if device == "sim":
        torch_offload.sim.set_copy_latency_us(10)
        torch_offload.sim.set_copy_bandwidth_gbps(25.0)
    if offloading.stats().tensors_offloaded == 0:
        sys.exit("bench/peers.py: the offloaded hook-cost row offloaded nothing")
    return rows


# --plan: the automatic plan against the tools that checkpoint or offload.
PLAN_R = (1.0, 3.0)
PLAN_STEPS = 5  # after the warm-up step: 6 steps per tool
AUTO = "ours auto"


class PlannedTool:
    """ours auto: enable_gradient_checkpointing(model, manager, plan="auto")
    with a streamed Manager, made when the tool's first step opens it.
    device_target_bytes counts all of the device's allocated memory, and
    the tools' models share the device, so the manager's target is `target`
    plus what the device held then, less this model's parameters: the other
    tools' models, gradients and AdamW state (listed last, this tool first
    steps after each of them has stepped once, so that what they hold stays
    the same from then on) and this run's batch."""

    def __init__(self, device, dm, model, target):
        self.device, self.dm, self.model, self.target = device, dm, model, target
        self.manager = self.planned = None

    def __enter__(self):
        if self.manager is None:
            params = sum(p.nbytes for p in self.model.parameters() if p.device.type != "cpu")
            target = self.dm.memory_allocated() - params + self.target
            self.manager = torch_offload.Manager(self.device, sync="streamed", device_target_bytes=target)
            self.manager.exclude(self.model.parameters())
            self.planned = torch_offload.enable_gradient_checkpointing(self.model, self.manager, plan="auto")
        return self.manager.__enter__()

    def __exit__(self, *exc):
        return self.manager.__exit__(*exc)

    def stats(self):
        return self.manager.stats()

    def plan_row(self):
        """What the plan did in the last step, for the tool's row."""
        s = self.manager.stats()
        return {
            "device_target_bytes": self.manager.options["device_target_bytes"],
            "blocks_kept": s.blocks_kept,
            "blocks_offloaded": s.blocks_offloaded,
            "blocks_recomputed": s.blocks_recomputed,
            "plan_predicted_step_us": s.plan_predicted_step_us,
            "plan_measured_step_us": s.plan_measured_step_us,
            "plan": self.planned.summary(),
        }


def plan_tools(device, dm, target):
    """The --plan rows (name -> factory, ours auto last) and name -> why unavailable."""
    tools, missing = make_tools(device)
    checkpoint_tools, checkpoint_missing = make_checkpoint_tools(device)
    chosen = {"none": tools["none"]}
    chosen.update({n: f for n, f in tools.items() if n.startswith("trl") and not n.endswith("no streams")})
    chosen.update(checkpoint_tools)
    chosen[AUTO] = lambda model: PlannedTool(device, dm, model, target)
    missing = {n: why for n, why in {**missing, **checkpoint_missing}.items() if n != "torchtune"}
    return chosen, missing


def plan_peak(row):
    """The most this run had allocated at once, steps 2 on (auto's first plan on)."""
    return max(row["step_peak_bytes"][1:])


def plan_seconds(row):
    """Median step time, steps 3 on (every plan learned)."""
    return statistics.median(row["step_seconds"][2:])


def plan_probe(device, dm, kind, layers, shape):
    """At sim's default link: the forward time of no offloading, the bytes
    offloading everything (ours streamed) copies to the host per step, and
    the peaks of no offloading and of checkpointing every layer with its
    input offloaded (ours checkpoint streamed)."""
    tools, _ = make_tools(device)
    checkpoint_tools, _ = make_checkpoint_tools(device)
    probe = {
        "none": tools["none"],
        "offload all": tools["ours streamed"],
        "checkpoint + offload inputs": checkpoint_tools["ours checkpoint streamed"],
    }
    gc.collect()
    rows = train_all(device, dm, probe, kind, layers, 3, shape, time_hooks=False)
    for name, row in rows.items():
        if "error" in row:
            sys.exit(f"bench/peers.py --plan: the probe's {name!r} raised: {row['error']}")
    return {
        "forward_s": rows["none"]["median_forward_s"],
        "bytes_offloaded_per_step": rows["offload all"]["bytes_offloaded_per_step"],
        "none_peak_bytes": plan_peak(rows["none"]),
        "checkpoint_offload_peak_bytes": plan_peak(rows["checkpoint + offload inputs"]),
    }


def plan_cell(device, dm, kind, layers, shape, probe, r_value):
    """One (model, layers, R) cell: sim's bandwidth set to bytes / (R x
    forward), every --plan tool trained in turn. Returns the cell."""
    gbps = probe["bytes_offloaded_per_step"] / (r_value * probe["forward_s"]) / 1e9
    torch_offload.sim.set_copy_bandwidth_gbps(gbps)
    low, high = probe["checkpoint_offload_peak_bytes"], probe["none_peak_bytes"]
    target = low + (high - low) // 2
    tools, missing = plan_tools(device, dm, target)
    gc.collect()  # the last cell's models, before the target counts what the device holds
    cell = {
        "model": kind,
        "layers": layers,
        "R": r_value,
        "bandwidth_gbps": gbps,
        "latency_us": torch_offload.sim.config()["copy_latency_us"],
        "probe": probe,
        "target_bytes": target,
        "device_bytes_before": dm.memory_allocated(),
        "missing": missing,
        "tools": train_all(device, dm, tools, kind, layers, PLAN_STEPS, shape, time_hooks=False),
    }
    base = cell["tools"]["none"]
    for name, row in cell["tools"].items():
        if "error" in row:
            continue
        row["peak_bytes"], row["median_step_s"] = plan_peak(row), plan_seconds(row)
        row["peak_ratio"] = row["peak_bytes"] / plan_peak(base)
        row["time_ratio"] = row["median_step_s"] / plan_seconds(base)
        row["losses_equal"] = row["losses"] == base["losses"]
        row["meets_target"] = row["peak_bytes"] <= 1.02 * target if name == AUTO else None
    return cell


def print_plan_cell(cell):
    where = f"| {cell['model']} | {cell['layers']} | {cell['R']:g} | {cell['bandwidth_gbps']:.3f} | "
    where += f"{cell['target_bytes'] / cell['tools']['none']['peak_bytes']:.3f} | "
    for name, row in cell["tools"].items():
        if "error" in row:
            print(f"{where}{name} | raises: {row['error']} | | | | | |")
            continue
        meets = "N/A" if row["meets_target"] is None else ("yes" if row["meets_target"] else "**no**")
        print(
            f"{where}{name} | {row['peak_bytes'] / 2**20:.2f} MiB | {row['peak_ratio']:.3f} | {meets} | "
            f"{row['median_step_s'] * 1000:.0f} | {row['time_ratio']:.2f} | "
            f"{'yes' if row['losses_equal'] else '**no**'} |"
        )
    for name, why in cell["missing"].items():
        print(f"{where}{name} | unavailable: {why} | | | | | |")


def run_plan(device, dm, models, shape, quick, out):
    """--plan: every cell, its table and DIR/peers-plan[-quick].json."""
    print(
        f"## The automatic plan against the Python peers on {device} (width {shape['model']['width']}, "
        f"seq {shape['model']['seq']}, batch {shape['batch']}; {PLAN_STEPS + 1} steps per tool)\n\n"
        "R = (bytes offloading everything copies to the host per step / link bandwidth) / forward time of "
        "none; sim's bandwidth is set to bytes / (R x forward), both measured first (at 25 GB/s). Target: "
        "halfway between the peaks of ours checkpoint streamed and of none, measured then. Peak: the most a "
        "run had allocated at once (model, gradients, AdamW state, the step's tensors), steps 2 on; step "
        "time: median of steps 3 on; meets: peak <= 1.02x target (ours auto only).\n"
    )
    print(
        "| model | layers | R | link GB/s | target / none | tool | peak | peak / none | meets target "
        "| step ms | step / none | losses = none |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = {"device": device, "quick": quick, "steps": PLAN_STEPS + 1, "shape": shape, "R": list(PLAN_R)}
    results.update(torch=torch.__version__, machine=platform.processor() or platform.machine(), cores=os.cpu_count())
    results["cells"] = []
    for kind, layers in ((kind, layers) for kind, counts in models for layers in counts):
        torch_offload.sim.set_copy_bandwidth_gbps(25.0)
        probe = plan_probe(device, dm, kind, layers, shape)
        for r_value in PLAN_R:
            cell = plan_cell(device, dm, kind, layers, shape, probe, r_value)
            print_plan_cell(cell)
            results["cells"].append(cell)
    torch_offload.sim.set_copy_bandwidth_gbps(25.0)
    autos = [c["tools"][AUTO] for c in results["cells"] if "error" not in c["tools"][AUTO]]
    print(
        f"\nours auto meets the target in {sum(r['meets_target'] for r in autos)}/{len(results['cells'])} cells, "
        f"losses bitwise those of none in {sum(r['losses_equal'] for r in autos)}/{len(results['cells'])}; "
        "its last step kept / offloaded / recomputed: "
        + "; ".join(
            f"{c['model']} L={c['layers']} R={c['R']:g}: {a['blocks_kept']}/{a['blocks_offloaded']}/"
            f"{a['blocks_recomputed']}"
            for c in results["cells"]
            if "error" not in (a := c["tools"][AUTO])
        )
    )
    write(results, os.path.join(out, f"peers-plan{'-quick' if quick else ''}.json"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["sim", "cuda"], required=True)
    parser.add_argument("--out", required=True, help="directory for peers[-plan|-cuda][-quick].json")
    parser.add_argument("--quick", action="store_true", help="fewer steps, a smaller model")
    parser.add_argument(
        "--models",
        help=f"comma-separated, from {', '.join(MODELS)} (default: all; with --plan the transformers ones)",
    )
    parser.add_argument(
        "--hooks-only",
        action="store_true",
        help="only the hook cost per saved tensor (writes DIR/peers-hooks[-cuda].json)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="the automatic plan against the checkpointing peers at R = 1 and 3 (sim; writes DIR/peers-plan.json)",
    )
    args = parser.parse_args()
    if args.plan and args.device != "sim":
        parser.error("--plan: --device must be sim (R is set through sim's link bandwidth)")

    device = args.device
    if device == "sim":
        import torch_offload.sim

        torch_offload.sim.install(host_power_of_two=True)  # pinned blocks as CUDA's caching host allocator
        bandwidths = [25.0, 1.0]  # GB/s; sim's default latency (10 us) throughout
    else:
        if not torch.cuda.is_available():
            sys.exit("bench/peers.py: --device cuda but torch.cuda.is_available() is False")
        bandwidths = [None]
    if args.hooks_only:
        results = {
            "device": device,
            "quick": args.quick,
            "torch": torch.__version__,
            "hook_cost": hook_cost(device, args.quick),
        }
        write(results, os.path.join(args.out, f"peers-hooks{'' if device == 'sim' else '-cuda'}.json"))
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    dm = torch.get_device_module(device)
    steps = 3 if args.quick else 7
    shape = (
        {"model": dict(width=256, heads=4, seq=64), "batch": 8}
        if args.quick
        else {"model": dict(width=256, heads=4, seq=128), "batch": 8}
    )
    accepted = [m for m in MODELS if m.startswith("transformers")] if args.plan else list(MODELS)
    chosen = args.models.split(",") if args.models else accepted
    unknown = [m for m in chosen if m not in accepted]
    if unknown:
        parser.error(f"--models: unknown {', '.join(map(repr, unknown))} (accepted: {', '.join(accepted)})")
    models = [(kind, MODELS[kind][1 if args.quick else 0]) for kind in chosen]
    if args.plan:
        run_plan(device, dm, models, shape, args.quick, args.out)
        return
    tools, missing = make_tools(device)
    peers = [n for n in tools if n != "none" and not n.startswith("ours")]
    checkpoint_tools, checkpoint_missing = make_checkpoint_tools(device)
    if any(kind.startswith("transformers") for kind in chosen):
        missing.update(checkpoint_missing)

    results = {
        "device": device,
        "quick": args.quick,
        "steps": steps,
        "shape": shape,
        "models": chosen,
        "missing": missing,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "cells": [],
        "matrix": {},
    }
    print(
        f"## Peers on {device} ({'quick' if args.quick else 'full'}: width {shape['model']['width']}, "
        f"seq {shape['model']['seq']}, batch {shape['batch']}, {steps} timed steps, median)\n"
    )
    for name, why in missing.items():
        print(f"- {name}: not run ({why})")
    print()
    print("R = (bytes ours blocking moves per step, both ways / link bandwidth) / forward time of none.\n")
    print(
        "| model | layers | link GB/s | R | tool | peak device | peak / none | peak pinned host | pinned host reserved "
        "| step ms | step / none | losses = none | host us per saved tensor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, layers in ((kind, layers) for kind, counts in models for layers in counts):
        for gbps in bandwidths:
            if gbps is not None:
                torch_offload.sim.set_copy_bandwidth_gbps(gbps)
            cell_tools = {**tools, **checkpoint_tools} if kind.startswith("transformers") else tools
            cell = {
                "model": kind,
                "layers": layers,
                "bandwidth_gbps": gbps,
                "latency_us": torch_offload.sim.config()["copy_latency_us"] if gbps is not None else None,
                "tools": train_all(device, dm, cell_tools, kind, layers, steps, shape),
            }
            base = cell["tools"]["none"]
            moved = cell["tools"].get("ours blocking", {}).get("bytes_moved_per_step")
            cell["R"] = (
                moved / (gbps * 1e9) / base["median_forward_s"]
                if gbps is not None and moved is not None and "median_forward_s" in base
                else None
            )
            r_text = f"{cell['R']:.2f}" if cell["R"] is not None else "-"
            where = f"| {kind} | {layers} | {gbps if gbps is not None else '-'} | {r_text} | "
            for name, row in cell["tools"].items():
                if "error" in row:
                    print(f"{where}{name} | raises: {row['error']} | | | | | | | |")
                    continue
                host = row["host_ns_per_saved_tensor"]
                row["peak_ratio"] = row["peak_bytes"] / base["peak_bytes"]
                row["time_ratio"] = row["median_step_s"] / base["median_step_s"]
                row["losses_equal"] = row["losses"] == base["losses"]
                host_text = f"{host / 1000:.1f}" if host is not None else "-"
                pinned = row["host_pinned_peak_bytes"]
                pinned_text = f"{pinned / 2**20:.2f} MiB" if pinned is not None else "-"
                reserved = row["host_pinned_reserved_bytes"]
                reserved_text = f"{reserved / 2**20:.2f} MiB" if reserved is not None else "-"
                print(
                    f"{where}{name} | {row['peak_bytes'] / 2**20:.2f} MiB | {row['peak_ratio']:.3f} | {pinned_text} | "
                    f"{reserved_text} | {row['median_step_s'] * 1000:.0f} | {row['time_ratio']:.2f} | "
                    f"{'yes' if row['losses_equal'] else 'no'} | {host_text} |"
                )
            ok = {n: r for n, r in cell["tools"].items() if "error" not in r}
            ours = ok.get("ours streamed")
            peer_rows = [ok[n] for n in peers if n in ok]
            if ours and peer_rows:
                cell["target_peak"] = ours["peak_bytes"] <= 1.05 * min(r["peak_bytes"] for r in peer_rows)
                cell["target_time"] = all(ours["time_ratio"] < r["time_ratio"] for r in peer_rows)
            hf_offload = next((r for n, r in ok.items() if n.startswith("hf checkpoint offload=True")), None)
            ours_ckpt = ok.get("ours checkpoint streamed")
            if hf_offload and ours_ckpt:
                cell["checkpoint_vs_hf_offload"] = {
                    "peak_ratio": ours_ckpt["peak_bytes"] / hf_offload["peak_bytes"],
                    "time_ratio": ours_ckpt["median_step_s"] / hf_offload["median_step_s"],
                }
            results["cells"].append(cell)

    results["hook_cost"] = hook_cost(device, args.quick)

    # Correctness matrix: poison and a slow link on, as in the tests.
    if device == "sim":
        torch_offload.sim.set_poison_freed(True)
        torch_offload.sim.set_copy_latency_us(300)
    names = [n for n in tools if n != "none"]
    print("\n## Correctness matrix (exact / differs / raises: first line of the error)\n")
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for case in cases.CASES:
        try:
            reference = cases.CASES[case](contextlib.nullcontext, device)
        except Exception as e:
            reference = first_line(e)
        row = {n: matrix_cell(case, tools[n], device, reference) for n in names}
        results["matrix"][case] = row
        print(f"| {case} | " + " | ".join(row[n] for n in names) + " |")
    if device == "sim":
        torch_offload.sim.set_poison_freed(False)
        torch_offload.sim.set_copy_latency_us(10)

    exact = all(
        r["ours blocking"].startswith("exact") and r["ours streamed"].startswith("exact")
        for r in results["matrix"].values()
    )
    peak_ok = [c.get("target_peak") for c in results["cells"]]
    time_ok = [c.get("target_time") for c in results["cells"]]
    results["targets"] = {"peak": all(peak_ok), "time": all(time_ok), "exact": exact}
    print(
        f"\nTargets: ours streamed peak <= 1.05x the lowest peer peak: "
        f"{sum(bool(x) for x in peak_ok)}/{len(peak_ok)} cells; step-time ratio below every peer's: "
        f"{sum(bool(x) for x in time_ok)}/{len(time_ok)} cells; ours exact in every matrix cell: "
        f"{'yes' if exact else 'no'}"
    )
    versus = [c for c in results["cells"] if "checkpoint_vs_hf_offload" in c]
    if versus:
        print(
            "\nCheckpoint + offload, ours checkpoint streamed / hf checkpoint offload=True: "
            + "; ".join(
                f"{c['model']} L={c['layers']} {c['bandwidth_gbps']} GB/s: "
                f"peak {c['checkpoint_vs_hf_offload']['peak_ratio']:.3f}x, "
                f"step {c['checkpoint_vs_hf_offload']['time_ratio']:.2f}x"
                for c in versus
            )
        )
    name = f"peers{'' if device == 'sim' else '-cuda'}{'-quick' if args.quick else ''}.json"
    write(results, os.path.join(args.out, name))


def write(results, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"\n(raw numbers: {os.path.relpath(path, ROOT)})")


if __name__ == "__main__":
    main()
