"""The runtime's own CPU time per iteration against DDP's, on replay models (issue 58, part 3).

    python benchmarks/cpu_cost.py [--model replay-resnet50] [--device h100] [--batch 32] [--ranks 2]
                                  [--iters 20] [--policies ddp,fifo,bytescheduler,prophet] [--keep-plans]
                                  [--json FILE]
    python benchmarks/cpu_cost.py --table FILE    # the table again, from a --json FILE

A replay model (gradsched.bench.workloads) has the real parameter tensors of a large model and
real autograd hooks, but each layer's compute is a paced wait: the CPU it leaves busy is what
autograd, the wrapper (DDP's reducer, or gradsched's hooks, launcher and completion threads) and
gloo spend, which is what decides, on a GPU, whether the training thread keeps the device fed.
The ranks run on loopback (no bandwidth limit, gloo over 127.0.0.1, one intra-op thread each),
every runner one after the other in blocks of four iterations, so that drift hits all alike; a
block ends once its last round's messages are through (a policy that crosses the iteration
barrier sends them during the next forward pass), so no runner's CPU is counted in another's.

Per iteration (a block's over four), on rank 0, medians over the blocks:

* ``process``: the CPU time of the whole process (every thread, gloo's included);
* ``training``: the training thread's own CPU time;
* ``threads``: each other Python thread's, by name (gradsched's launcher, completion, ...);
* per tensor and per message: ``process`` over the parameter tensors and over the messages of
  the plan in use (DDP: its buckets);
* ``of H100``: ``process`` as a share of the replay profile's compute time on the ``--device``
  preset: above 1, one CPU core could not keep up even with nothing else to do;
* ``copied MB``: the gradients' bytes gradsched's messages carried in a copy (those not one
  range of the gradients' homes: gradsched.runtime.comm.layout).

gradsched's own data plane is kept (``handoff=False``), as the trial would otherwise hand the
buckets it keeps to DDP's reducer, whose cost is DDP's; with ``--keep-plans`` each policy runs
its own plans (no trial: on loopback's unlimited link it keeps DDP-style buckets).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time

from gradsched.bench.processes import local_ranks, script_args, script_result, script_settings

BLOCK = 4  # iterations of one runner measured together, the last one's communication waited for

def thread_cpu() -> dict[str, float]:
    """Every live Python thread's CPU seconds, summed by name (the training thread as ``training``)."""
    out: dict[str, float] = {}
    main = threading.main_thread()
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError):  # ended meanwhile, or not started
            continue
        name = "training" if thread is main else thread.name.rstrip("-0123456789")
        out[name] = out.get(name, 0.0) + seconds
    return out


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradsched
    from gradsched.bench.workloads import workload

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    work = workload(args.model, args.batch, args.device, launch_share=args.launch_share)
    generator = torch.Generator().manual_seed(0)
    x, y = work.batch(generator)
    runners, pacers = {}, {}
    for name in args.policies:
        torch.manual_seed(0)
        model = work.build()
        optimizer = work.optimizer(model)
        pacers[name] = model.pacer
        if name == "ddp":
            runners[name] = (DDP(model), optimizer, len(list(model.parameters())))
        else:
            wrapped, optimizer = gradsched.wrap(model, optimizer, name, handoff=False, fallback=not args.keep_plans)
            runners[name] = (wrapped, optimizer, len(list(model.parameters())))

    def iteration(model, optimizer) -> None:
        optimizer.zero_grad()
        work.loss(model(x), y).backward()
        optimizer.step()

    for name, (model, optimizer, _) in runners.items():  # gradsched's: past profiling and the measured trial
        rounds = args.warmup if name == "ddp" else max(args.warmup, optimizer.stats.settled_round + 1)
        for _ in range(rounds):
            iteration(model, optimizer)
    def copied(optimizer) -> int:  # bytes gradsched's launcher has sent in copies so far (0 for DDP's)
        coordinator = getattr(optimizer, "_coordinator", None)
        return 0 if coordinator is None else coordinator.backend.exchange.launcher.copied_bytes

    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for _ in range(0, args.iters, BLOCK):
        for name, (model, optimizer, _) in runners.items():
            dist.barrier()
            launched = dataclasses.replace(pacers[name].launched)
            wall, process, threads, sent = time.perf_counter(), time.process_time(), thread_cpu(), copied(optimizer)
            for _ in range(BLOCK):
                iteration(model, optimizer)
            if name != "ddp":  # a policy crossing the barrier sends the block's last round during the
                optimizer.synchronize()  # next forward pass: counted here, not in the next runner's block
            after = thread_cpu()
            sample = {"wall": time.perf_counter() - wall, "process": time.process_time() - process,
                      "copied_bytes": copied(optimizer) - sent}
            sample.update({f"thread:{k}": v - threads.get(k, 0.0) for k, v in after.items()})
            now = pacers[name].launched
            if args.launch_share:
                sample.update({"launch:cpu": now.cpu_s - launched.cpu_s, "launch:wall": now.wall_s - launched.wall_s,
                               "launch:interpreter": now.interpreter_s - launched.interpreter_s,
                               "launch:blocked": now.blocked - launched.blocked})
            samples[name].append({k: v / BLOCK for k, v in sample.items()})
    out = {"compute_s": work.table.compute_s, "policies": {}}
    for name, (model, optimizer, tensors) in runners.items():
        messages, plan = None, "DDP's buckets"  # (DDP does not say how many buckets it reduces)
        if name != "ddp":
            stats = optimizer.stats.as_dict()
            messages, plan = stats.get("plan_messages"), stats.get("plan_policy")
            optimizer.close()
        keys = sorted({k for s in samples[name] for k in s})
        medians = {k: statistics.median(s.get(k, 0.0) for s in samples[name]) for k in keys}
        out["policies"][name] = {"median": medians, "tensors": tensors, "messages": messages, "plan": plan,
                                 "iterations": len(samples[name]) * BLOCK}
    if rank == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


def own(median: dict[str, float]) -> float:
    """The wrapper's and the training thread's CPU seconds: the training thread's and every
    gradsched thread's (gloo's C++ threads, which move the same bytes for both, left out)."""
    return sum(v for k, v in median.items() if k == "thread:training" or k.startswith("thread:gradsched"))


def copied_mb(policy: dict, name: str) -> str:
    """MB an iteration gradsched sent in copies (messages not one range of the gradients' homes);
    '-' for DDP (its reducer copies every gradient into its buckets, in C++)."""
    value = policy["median"].get("copied_bytes")
    return f"{'-':>10s}" if value is None or name == "ddp" else f"{value / 1e6:10.1f}"


def table(data: dict) -> str:
    args, compute = data["args"], data["result"]["compute_s"]
    policies = data["result"]["policies"]
    ddp = policies.get("ddp")
    copies = any("copied_bytes" in p["median"] for p in policies.values())  # runs kept before the column have none
    lines = [f"{args['ranks']} ranks, loopback, {args['model']} ({args['device']} profile, batch {args['batch']}: "
             f"{compute * 1e3:.1f} ms compute), {policies[next(iter(policies))]['iterations']} iterations each, "
             "CPU ms per iteration (medians, rank 0)",
             f"  {'':14s} {'wall':>6s} {'process':>8s} {'C++':>6s} {'training':>9s} {'threads':>8s} {'own':>6s} "
             f"{'vs ddp':>7s} {'us/tensor':>10s} {'us/msg':>7s} {'of compute':>11s}"
             + (f" {'copied MB':>10s}" if copies else "") + "  plan"]
    for name, p in policies.items():
        m = p["median"]
        python = sum(v for k, v in m.items() if k.startswith("thread:"))
        threads = own(m) - m.get("thread:training", 0.0)
        mine = own(m)
        versus = f"{mine / own(ddp['median']):6.2f}x" if ddp else "      -"
        per_message = f"{mine / p['messages'] * 1e6:7.0f}" if p.get("messages") else f"{'-':>7s}"
        plan = p["plan"] if p["messages"] is None else f"{p['plan']}, {p['messages']} messages"
        lines.append(f"  {name:14s} {m['wall'] * 1e3:6.1f} {m['process'] * 1e3:8.1f} {(m['process'] - python) * 1e3:6.1f} "
                     f"{m.get('thread:training', 0.0) * 1e3:9.1f} {threads * 1e3:8.1f} {mine * 1e3:6.1f} {versus} "
                     f"{mine / p['tensors'] * 1e6:10.0f} {per_message} {mine / compute:11.2f}"
                     + (f" {copied_mb(p, name)}" if copies else "") + f"  {plan}")
    if any("launch:cpu" in p["median"] for p in policies.values()):
        lines.append(f"  each op launched by CPU work of {args['launch_share']:.0%} of its time (ms per iteration): the "
                     "training thread's launch work (CPU), its wall time, the part neither running nor queued for a CPU "
                     "(interrupts, which on loopback carry the network's work, and waits for the interpreter), how "
                     "often it blocked on the interpreter, and the iteration's wall time")
        lines.append(f"  {'':14s} {'launch':>7s} {'wall':>7s} {'not run':>8s} {'blocked':>8s} {'iteration':>10s}")
        for name, p in policies.items():
            m = p["median"]
            lines.append(f"  {name:14s} {m['launch:cpu'] * 1e3:7.1f} {m['launch:wall'] * 1e3:7.1f} "
                         f"{m['launch:interpreter'] * 1e3:8.2f} {m.get('launch:blocked', 0):8.0f} {m['wall'] * 1e3:10.1f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="replay-resnet50", help="a replay model (default replay-resnet50)")
    parser.add_argument("--device", default="h100", help="the profile's device preset (default h100)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20, help="measured iterations of each runner (default 20)")
    parser.add_argument("--warmup", type=int, default=16, help="at least; gradsched's: past its measured trial")
    parser.add_argument("--policies", default="ddp,fifo,bytescheduler,prophet",
                        type=lambda s: [p for p in s.split(",") if p], help="ddp and gradsched policies")
    parser.add_argument("--launch-share", type=float, default=0.0,
                        help="launch each replayed op with CPU work of this share of its time, taking and releasing "
                             "the interpreter lock as eager kernel launches do (default 0: none); the table then "
                             "shows the training thread's launch work and how long it waited for the interpreter")
    parser.add_argument("--keep-plans", action="store_true",
                        help="keep each policy's own plans (no measured trial against DDP-style buckets, which "
                             "loopback's unlimited link decides for the buckets)")
    args = script_args(parser, worker, table)
    if args is None:
        return
    if not args.model.startswith("replay-"):
        parser.error(f"--model must be a replay model (replay-resnet50, replay-transformer, ...), got {args.model!r}")
    if args.iters < BLOCK:
        parser.error(f"--iters must be >= {BLOCK}")
    if not 0.0 <= args.launch_share < 1.0:
        parser.error(f"--launch-share must be in [0, 1), got {args.launch_share}")
    result = local_ranks([__file__, "--worker", *sys.argv[1:]], args.ranks)
    script_result(args, {"args": script_settings(args), "result": result}, table)


if __name__ == "__main__":
    main()
