"""A run's spec: what a run measures and how, parsed and checked once (RunSpec).

Built by exactly two functions: session.from_command_line (the flags and the suite file;
it asks the host what the launcher must know) and from_saved here (a run directory's
meta.json: a resume, and a rank that its `run --np` launcher started, which reads the spec
its launcher wrote there rather than parse its command line again). Under mpirun/srun/
torchrun each rank builds it from its own command line, and the ranks agree on rank 0's
once the world is up (refuse_disagreement). The spec travels as a plain dict (to_dict,
from_dict): meta.json's "spec". A rank imports this module, so it imports no launcher."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from commbench import backends
from commbench.analyse.profiles import Profile, profile_from_fields
from commbench.benchmarks import get
from commbench.core.errors import UsageError
from commbench.run import suite as suite_mod
from commbench.run.suite import SuiteConfig
from commbench.run.variants import VariantPlan, lookup
from commbench.run.variants import plan as plan_variants
from commbench.store.record import RunRecord, read_meta_file

# The layout of a spec as meta.json holds it; a spec of another layout is refused, not guessed.
SPEC_VERSION = 1
# What each rank of an external launch has of its own: the directory it names (a time stamp;
# rank 0's is the run's), and where the suite and profile files lie on its host (an install
# path). What those files say is in the config and the profile, which every rank must share.
PER_RANK = ("out", "suite_file", "shadows")


@dataclass(frozen=True)
class RunSpec:
    config: SuiteConfig  # the suite with the flags applied: sizes in bytes, params per benchmark
    suite_file: str | None  # the file the suite name resolved to (None: -b without a suite)
    shadows: str | None  # the shipped suite that file hides (a ./suites or COMMBENCH_SUITES one)
    backend: str
    device: str
    np: int | None  # the local ranks this command starts; None: it is one rank of an external launch
    np_note: str  # the line that says why that many, when no --np chose them
    world: int  # the ranks of the launch
    ranks_per_node: int | None
    repeat: int
    variant: str | None  # --variant: the one variant this launch runs
    variant_plan: tuple[tuple[str, str | None], ...]  # each variant, and why it cannot run here (None: it can)
    baseline: str | None  # what the variants' speedups are measured against
    plan_note: str  # why the suite's baseline was not used, when it was not
    profile: Profile | None  # --profile (or the suite's) loaded, overrides applied; None: the device's, at start
    profile_overrides: dict
    out: str  # the run directory

    def __post_init__(self):
        def need(ok: bool, field: str, what: str):
            if not ok:
                raise UsageError(f"run spec: {field} must be {what}, got {getattr(self, field)!r}")
        need(isinstance(self.config, SuiteConfig), "config", "a suite config")
        need(self.backend in backends.BACKENDS, "backend", f"one of {', '.join(backends.BACKENDS)}")
        need(self.device in ("cpu", "cuda"), "device", "cpu or cuda")
        for name, least in (("world", 1), ("repeat", 1), ("np", 1), ("ranks_per_node", 1)):
            v = getattr(self, name)
            need((v is None and name in ("np", "ranks_per_node"))
                 or (isinstance(v, int) and not isinstance(v, bool) and v >= least), name, f"an integer >= {least}")
        need(isinstance(self.out, str) and bool(self.out), "out", "a directory")
        need(all(isinstance(n, str) and (w is None or isinstance(w, str)) for n, w in self.variant_plan)
             and bool(self.variant_plan), "variant_plan", "pairs of a variant name and why it cannot run (or null)")
        need(self.profile is None or isinstance(self.profile, Profile), "profile", "a profile's fields or null")
        need(isinstance(self.profile_overrides, dict), "profile_overrides", "a table")
        for name in ("suite_file", "shadows", "variant", "baseline", "np_note", "plan_note"):
            need(isinstance(getattr(self, name), str) or (getattr(self, name) is None and not name.endswith("note")),
                 name, "a string" + ("" if name.endswith("note") else " or null"))

    @property
    def suite(self) -> str:
        return self.config.name

    @property
    def source(self) -> tuple[str, str | None] | None:
        """(the suite file, the shipped suite it hides), said at the start of a run."""
        return (self.suite_file, self.shadows) if self.suite_file else None

    def vplan(self) -> VariantPlan:
        """The variant plan, with each variant's settings (variants.plan's answer, kept)."""
        return VariantPlan(tuple((lookup(self.config, n), why) for n, why in self.variant_plan), self.baseline,
                           self.plan_note)

    def to_dict(self) -> dict:
        """The spec as plain JSON values (meta.json's "spec")."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(config=asdict(self.config), profile=asdict(self.profile) if self.profile else None,
                 variant_plan=[list(x) for x in self.variant_plan])
        return {"version": SPEC_VERSION, **json.loads(json.dumps(d, default=str))}

    def digest(self) -> str:
        """What the ranks of one launch must agree on (all but what is each rank's own)."""
        return hashlib.sha256(json.dumps(_shared(self.to_dict()), sort_keys=True).encode()).hexdigest()


def _shared(d: dict) -> dict:
    """A spec's dict without what each rank has of its own (PER_RANK, the profile's path)."""
    out = {k: v for k, v in d.items() if k not in PER_RANK}
    if isinstance(out.get("profile"), dict):
        out["profile"] = {k: v for k, v in out["profile"].items() if k != "source_path"}
    return out


def from_dict(d: dict, where: str = "run spec", timeout_s: float | None = None) -> RunSpec:
    """A spec from its to_dict form, through the checks a new run's passes: a field it lacks
    or does not know, or a value of the wrong kind, is refused in one line naming it."""
    if not isinstance(d, dict):
        raise UsageError(f"{where}: not a table")
    if d.get("version") != SPEC_VERSION:
        raise UsageError(f"{where}: version {d.get('version')!r}, where this commbench reads {SPEC_VERSION}")
    names = [f.name for f in fields(RunSpec)]
    unknown = sorted(set(d) - set(names) - {"version"})
    missing = [n for n in names if n not in d]
    if unknown or missing:
        raise UsageError(f"{where}: " + (f"unknown field {unknown[0]!r}" if unknown else f"no field {missing[0]!r}"))
    if not isinstance(d["variant_plan"], list) or not all(isinstance(x, list) and len(x) == 2
                                                          for x in d["variant_plan"]):
        raise UsageError(f"{where}: variant_plan must be a list of [name, why or null] pairs")
    try:
        config = config_from_saved(d["config"], {"timeout_s": timeout_s})
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    profile = None if d["profile"] is None else profile_from_fields(d["profile"], f"{where}: profile")
    return RunSpec(**{**{n: d[n] for n in names}, "config": config, "profile": profile,
                      "variant_plan": tuple(tuple(x) for x in d["variant_plan"])})


def disagreement(rank0: dict, mine: dict) -> str | None:
    """The first field (config's and profile's by their key) in which a rank's spec differs
    from rank 0's, as one line; None when they agree. What each rank has of its own (its
    directory, where its files lie) is not compared."""
    rank0, mine = _shared(rank0), _shared(mine)
    for key in [*rank0, *sorted(set(mine) - set(rank0))]:
        a, b = rank0.get(key), mine.get(key)
        if a == b:
            continue
        if key in ("config", "profile") and isinstance(a, dict) and isinstance(b, dict):
            sub = next(k for k in [*a, *sorted(set(b) - set(a))] if a.get(k) != b.get(k))
            key, a, b = f"{key}.{sub}", a.get(sub), b.get(sub)
        return f"{key}: rank 0 has {json.dumps(a, default=str)}, this rank {json.dumps(b, default=str)}"
    return None


def refuse_disagreement(rank0: dict, mine: dict, rank: int) -> None:
    """Ranks of one launch that built different specs (another command line, suite file or
    environment on some host) would measure one run two ways: refused, naming the field."""
    why = disagreement(rank0, mine)
    if why is not None:
        raise UsageError(f"the ranks of this launch were given different runs: rank {rank} differs from rank 0 "
                         f"in {why}")


def checked_config(raw: dict, overrides: dict | None = None, param_args: list[str] | None = None) -> SuiteConfig:
    """The one way a SuiteConfig is made: a suite table (a file's, or a saved one), the flags
    that override it, and --param words."""
    return suite_mod.build_config(raw, overrides, param_args)


def config_from_saved(saved: dict, overrides: dict | None = None) -> SuiteConfig:
    """The config a run was measured with (meta.json's `config`, or a spec's) through the
    same checks as a new run's."""
    return checked_config(suite_mod.saved_table(saved), overrides)


# --- a spec from a saved run -------------------------------------------------------------

def from_saved(run_dir, timeout_s: float | None = None) -> RunSpec:
    """The spec of the run in run_dir: the one its launcher or rank 0 wrote (meta.json's
    "spec"), or for a run recorded before specs were, the one its meta.json's fields give.
    timeout_s: --timeout, the one setting a resume may change."""
    where = f"{run_dir}/meta.json"
    saved = RunRecord.read_spec(run_dir)
    if saved is not None:
        return replace(from_dict(saved, f"{where}: spec", timeout_s), out=str(run_dir))
    meta = read_meta_file(f"{run_dir}/meta.json")
    cfg = config_from_saved(meta.get("config") or {}, {"timeout_s": timeout_s})
    backend, device = meta.get("backend"), meta.get("device") or "cpu"
    if backend not in backends.BACKENDS:
        raise UsageError(f"{where}: backend {backend!r} is not one of {', '.join(backends.BACKENDS)}")
    vplan = plan_variants(cfg, backend, device)
    return RunSpec(config=cfg, suite_file=None, shadows=None, backend=backend, device=device, np=None, np_note="",
                   world=meta.get("world"), ranks_per_node=meta.get("ranks_per_node"),
                   repeat=int(meta.get("repeat") or 1), variant=None,
                   variant_plan=tuple((v.name, why) for v, why in vplan.entries), baseline=vplan.baseline,
                   plan_note=vplan.note, profile=None, profile_overrides=meta.get("profile_overrides") or {},
                   out=str(run_dir))


# --- the checks a spec passes when built -----------------------------------------------

def launch_nodes(np_: int | None, world: int, ranks_per_node: int | None) -> int | None:
    """The nodes a launch spans as far as the launcher knows: --ranks-per-node groups the
    ranks; --np alone starts them all on this host. None under mpirun/srun without
    --ranks-per-node: hostnames tell, on the ranks."""
    if ranks_per_node:
        return -(-world // ranks_per_node)
    return 1 if np_ is not None else None


def check_nodes(points: list, nodes) -> None:
    """A point that cannot run on these nodes (a count, or the node of each rank), refused
    in one line: at the launcher before any rank starts, on the ranks before any measurement."""
    for p in points:
        count = nodes if nodes is None or isinstance(nodes, int) else len(set(list(nodes)[:p.world]))
        why = get(p.benchmark).nodes_refusal(p, count)
        if why:
            raise UsageError(why)


def check_backend(cfg: SuiteConfig, backend: str, device: str) -> None:
    """What the chosen backend and device cannot run, refused before any rank starts."""
    if device == "cuda":
        host_only = [b for b in cfg.benchmarks if backend in get(b).host_only_on]
        if host_only:
            raise UsageError(f"{host_only[0]} packs rows on the host on {backend}: CPU buffers only there "
                             f"(on GPUs, --backend nccl runs it on the device)")
    for name in cfg.benchmarks:
        why = get(name).refusal(backend, device, cfg.params.get(name, {}))
        if why:
            raise UsageError(why)
    if cfg.cuda_graph and backend != "nccl":
        raise UsageError("--cuda-graph needs the nccl backend: MPI and gloo calls run on the host, where a CUDA graph "
                         "cannot capture them")
