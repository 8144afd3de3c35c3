"""Every key in a cluster's store: the one place the layout is spelled (DESIGN "The store is the control plane").

The CLI, the agent, the providers and the start-up script renderer build keys only through these functions.
`DESCRIBED` is the layout as docs/store.md's "Every key in the store" shows it; a test keeps the two equal.
"""
from __future__ import annotations

CLUSTER_RECORD = "tpuctl/cluster.json"
STOPPED = "tpuctl/stopped.json"
TEARDOWN_CHECK = "tpuctl/teardown-check.json"
AGENT_PACKAGE_PREFIX = "tpuctl/agent/"
JOB_PACKAGE_PREFIX = "tpuctl/packages/"
RUNS_PREFIX = "tpuctl/runs/"
BOOT_PREFIX = "tpuctl/boot/"
AGENTS_PREFIX = "tpuctl/agents/"
OUTPUTS_PREFIX = "runs/"
BLOBS_PREFIX = "tpuctl/blobs/"
WATCH_ARMED = "tpuctl/watch/armed.json"
WATCH_LEASE = "tpuctl/watch/lease.json"
RECOVERIES_PREFIX = "tpuctl/watch/recoveries/"
QUEUE_PREFIX = "tpuctl/queue/"
RUN_INDEX_PREFIX = "tpuctl/index/runs/"
RUN_INDEX_COMPLETE = "tpuctl/index/complete"
SUBMITTING_PREFIX = "tpuctl/submitting/"
ORPHANS_CHECKED = "tpuctl/orphans-checked"
TPU_RUNTIME_PREFIX = "tpuctl/tpu-runtime/"
NOTIFY_TARGETS = "tpuctl/notify/targets.json"
NOTIFY_EVENTS_PREFIX = "tpuctl/notify/events/"
BUDGET = "tpuctl/budget.json"

def agent_package(version: str) -> str:
    """A wheel (agent_package.py says why): its file name must follow PEP 427 for pip to install it."""
    return f"{AGENT_PACKAGE_PREFIX}tpuctl-{version}-py3-none-any.whl"


NOTIFY_UNSENT_PREFIX = "tpuctl/notify/unsent/"


def notify_unsent(key: str) -> str:
    """A notification given up on for one URL (notify.py): what, to which host, why; `status` lists them."""
    return f"{NOTIFY_UNSENT_PREFIX}{key}.json"


def notify_event(key: str) -> str:
    """One notification, recorded create-if-absent before it is sent (notify.py): `key` names its occurrence."""
    return f"{NOTIFY_EVENTS_PREFIX}{key}.json"


def recovery(n: int) -> str:
    return f"{RECOVERIES_PREFIX}{n:06d}.json"


def queue_entry(run_id: str) -> str:
    """An unfinished run (runindex.py): listed oldest first."""
    return f"{QUEUE_PREFIX}{run_id}"


def submitting(run_id: str) -> str:
    """A run whose submit is copying its data and has not written its job.json yet (orphans.py)."""
    return f"{SUBMITTING_PREFIX}{run_id}"


def run_index(flipped_id: str) -> str:
    """A run in the newest-first index (runindex.py): its id flipped, so the newest lists first, in a folder per
    month (the flipped YYYYMM), so a directory store reads one month's entries for the latest, not every run's."""
    return f"{RUN_INDEX_PREFIX}{flipped_id[:6]}/{flipped_id}"


def run_remote(run_id: str) -> str:
    """A run that executes on a service (providers/base.py RemoteRuns): its sessions there, kept by the CLI."""
    return f"{run_prefix(run_id)}remote.json"


def run_remote_lease(run_id: str) -> str:
    """Whose tpuctl moves such a run on now (providers/kaggle/sessions.py): one at a time."""
    return f"{run_prefix(run_id)}remote.lease"


REMOTE_DATASETS = "tpuctl/remote/datasets.json"


def job_package(sha256: str) -> str:
    return f"{JOB_PACKAGE_PREFIX}{sha256}.tar.gz"


def watcher_package(version: str) -> str:
    """The recovery watcher VM's package: the agent's modules, the watcher and `up`'s code path (agent_package.py)."""
    return f"{AGENT_PACKAGE_PREFIX}watcher/tpuctl-{version}-py3-none-any.whl"


def boot_log(host: str) -> str:
    return f"{BOOT_PREFIX}{host}.log"


def agent_heartbeat(host: str, worker: int) -> str:
    return f"{AGENTS_PREFIX}{host}-w{worker}.json"


def _worker(worker: int) -> str:
    return "" if worker == 0 else f"-w{worker}"


def tpu_runtime_served(worker: int) -> str:
    """What TPU runtime worker N's tpu-runtime.service serves (host/podruntime.py)."""
    return f"{TPU_RUNTIME_PREFIX}w{worker}.json"


def run_tpu_runtime(run_id: str) -> str:
    """The TPU runtime a TensorFlow run on a multi-host base-runtime slice asks every worker to serve."""
    return f"{run_prefix(run_id)}tpu-runtime.json"


def run_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}{run_id}/"


def run_job(run_id: str) -> str:
    return f"{run_prefix(run_id)}job.json"


def run_claim(run_id: str, worker: int, attempt: int = 1) -> str:
    """The first attempt's claim is `claim[-wN]`; a takeover after a lost host claims `claim[-wN]-aK`."""
    return f"{run_prefix(run_id)}claim{_worker(worker)}" + ("" if attempt == 1 else f"-a{attempt}")


def run_status(run_id: str, worker: int) -> str:
    return f"{run_prefix(run_id)}status{_worker(worker)}.json"


def run_logs(run_id: str, worker: int) -> str:
    return f"{run_prefix(run_id)}logs{_worker(worker)}/"


def log_chunk(run_id: str, worker: int, n: int) -> str:
    return f"{run_logs(run_id, worker)}{n:06d}.log"


def run_notify(run_id: str) -> str:
    """`submit --notify`: the run's own notification URLs (secrets, like the cluster's)."""
    return f"{run_prefix(run_id)}notify.json"


def run_cancel(run_id: str) -> str:
    return f"{run_prefix(run_id)}cancel"


def run_drill(run_id: str, start: int) -> str:
    """`tpuctl drill -c CLUSTER`'s request to the agent for the job's start `start` (TPUCTL_RESTARTS): the signal
    and its grace (host/supervisor.py delivers it); the agent answers at run_drill_done."""
    return f"{run_prefix(run_id)}drills/{start:04d}.json"


def run_drill_done(run_id: str, start: int) -> str:
    """What the agent did with run_drill's request: when it signalled, when the job ended, whether SIGKILL ended it."""
    return f"{run_prefix(run_id)}drills/{start:04d}.done.json"


def run_rounds(run_id: str) -> str:
    return f"{run_prefix(run_id)}rounds/"


def run_round(run_id: str, n: int) -> str:
    """Round n of a run across many hosts (host/rounds.py): who asked for it and why; written once."""
    return f"{run_rounds(run_id)}{n:04d}.json"


def run_round_ready(run_id: str, n: int, worker: int, done: bool = False) -> str:
    """Worker N's mark that it is ready to start round n (the round starts once every worker's is there), or, with
    `done`, that its job ended well in round n (the run succeeds once every worker's is there)."""
    return f"{run_rounds(run_id)}{n:04d}-{'done-' if done else ''}w{worker}"


def run_output(run_id: str) -> str:
    return f"{OUTPUTS_PREFIX}{run_id}/output"


def run_metrics(run_id: str) -> str:
    """The job's metrics file (metrics.py), written through tpuctl.runtime into its output directory."""
    return f"{run_output(run_id)}/metrics.json"


def run_chips(run_id: str, worker: int) -> str:
    """Worker N's TPU (or GPU) duty cycle and HBM use while the run ran (utilisation.py): in the run's record, beside
    its status, so the job's outputs (what `download` fetches, what the job lists) hold only what the job wrote."""
    return f"{run_prefix(run_id)}tpu-metrics{_worker(worker)}.json"


def run_stacks(run_id: str, worker: int) -> str:
    """Worker N's job's stacks, taken when the run stalled (host/stacks.py): `tpuctl logs RUN --stacks` prints them.
    Named stacks-wN.txt for every worker, worker 0 too, so a listing sorts them by host."""
    return f"{run_prefix(run_id)}stacks-w{worker}.txt"


SICK_PREFIX = "tpuctl/sick/"


def host_sick(host: str) -> str:
    """A host that failed to get its TPU twice in a row (host/failures.py): `status` names it; it is to be
    replaced through the lost-host path."""
    return f"{SICK_PREFIX}{host}.json"


def run_stalls(run_id: str) -> str:
    """The run's stalls (host/doctor.py), one record each: when its progress stopped, when it was seen, what was
    done; goodput counts the time as badput `stalled` (goodput.py)."""
    return f"{run_prefix(run_id)}stalls/"


def blob(md5: str) -> str:
    """A data file's content, stored once whatever its name (content-addressed by md5)."""
    return f"{BLOBS_PREFIX}{md5}"


def compile_cache(cache_key: str) -> str:
    """A job's JAX compilation cache (host/compilecache.py), packed by worker 0's agent, for a host made again: one
    per job code and JAX/libtpu versions, shared by that job's runs on the cluster."""
    return f"tpuctl/compile-cache/{cache_key}.tar.gz"


def run_data(run_id: str) -> str:
    """What one run sees as its data ($TPUCTL_DATA_DIR): copies of blobs under their relative paths."""
    return f"{OUTPUTS_PREFIX}{run_id}/data/"


def run_id_of(key: str) -> str | None:
    """The run id of a `tpuctl/runs/<id>/job.json` key, else None."""
    if key.startswith(RUNS_PREFIX) and key.endswith("/job.json"):
        return key[len(RUNS_PREFIX):-len("/job.json")]
    return None


# (key as built above with placeholders, who writes it and when), in the docs' order.
DESCRIBED = [
    (CLUSTER_RECORD, "written by `up`: what the host agent needs (TPU address, type, runtime)"),
    (STOPPED, "written by the agent that ended the compute itself (autostop, deadline, submit --down): why, when"),
    (TEARDOWN_CHECK, "written by worker 0 at boot: whether the host's identity may delete the compute itself"),
    (WATCH_ARMED, "written by `up --recover`, the watcher and `down`: the recovery settings, the cluster's state, why "
                  "it ended"),
    (WATCH_LEASE, "the recovery watcher's lease (conditional writes only): who may re-create the compute now"),
    (recovery(1).replace("000001", "NNNNNN"), "one per recovery: when and why the compute was lost, where it came back"),
    (BUDGET, "written by `up`: the price per hour, the periods the compute existed, the budget (up --budget)"),
    (NOTIFY_TARGETS, "written by `up --notify`: the cluster's notification URLs (secrets)"),
    (notify_event("KEY"), "one per notification, written before it is sent (so it is sent once)"),
    (notify_unsent("KEY-URLHASH"), "a notification given up on for one URL: event, host, error (status)"),
    (agent_package("VERSION"), "the agent package the hosts install, built from the CLI that ran `up`"),
    (watcher_package("VERSION"), "the recovery watcher VM's package (up --recover --watcher vm)"),
    (boot_log("HOST"), "each host's start-up script log"),
    (agent_heartbeat("HOST", 0).replace("-w0", "-wN"), "each agent's heartbeat"),
    (tpu_runtime_served(0).replace("w0", "wN"), "TensorFlow on a multi-host base-runtime slice: the TPU runtime "
                                                "image worker N's tpu-runtime.service serves, and for which run"),
    (job_package("SHA256"), "content-addressed job code, uploaded only if absent"),
    (blob("MD5"), "each data file's content, uploaded once (unchanged content is never sent again)"),
    (compile_cache("KEY"), "a job's JAX compilation cache (per job code and JAX/libtpu versions), packed by worker 0's "
                           "agent after the job exits, for a host made again"),
    (run_job("ID"), "the run, written once by `submit` (create-if-absent)"),
    (queue_entry("ID"), "an unfinished run, oldest first: the agents' queue (removed once the run is final)"),
    (f"{RUN_INDEX_PREFIX}FLIPPED-MONTH/FLIPPED-ID", "every run, newest first (its id with each digit d as 9-d): "
                                                    "what `jobs` and `logs` list"),
    (RUN_INDEX_COMPLETE, "written once the store's runs are all indexed (a store without it is indexed again)"),
    (submitting("ID"), "written by `submit` before it copies a run's data, removed once its job.json is written: "
                       "left behind, it marks data of a run never submitted (`status` shows it, `down` removes it)"),
    (ORPHANS_CHECKED, "written once the store's run data has been looked over for what earlier releases left"),
    (run_claim("ID", 0) + "[-wN][-aK]", "written once by the agent that takes the run (worker N, attempt K)"),
    (run_status("ID", 0).replace("status.json", "status[-wN].json"), "state, exit code, heartbeat, host"),
    (log_chunk("ID", 0, 1).replace("logs/", "logs[-wN]/"), "ordered log chunks, each written once"),
    (run_chips("ID", 0).replace("metrics.json", "metrics[-wN].json"), "each chip's duty cycle and HBM use on worker "
                                                                      "N, sampled by its agent (or why none)"),
    (run_cancel("ID"), "written by `tpuctl cancel`"),
    (run_round("ID", 2).replace("0002", "NNNN"), "a run across many hosts: written once by the host that restarts "
                                                 "it on every host (a lost host, exit 42), or ends it (a failure)"),
    (run_round_ready("ID", 2, 0).replace("0002-w0", "NNNN[-done]-wN"), "worker N is ready to start round NNNN "
                                                                       "(its job ended well in it): the round starts "
                                                                       "(the run succeeds) once every worker's is there"),
    (run_tpu_runtime("ID"), "written by worker 0 before a TensorFlow run on a multi-host base-runtime slice: the "
                            "TPU runtime every worker must serve first"),
    (run_notify("ID"), "written by `submit --notify`: the run's own notification URLs (secrets)"),
    (run_remote("ID"), "a Kaggle run's sessions (kernel, state, times), kept by the commands that look at it"),
    (run_remote_lease("ID"), "which tpuctl moves that run on now (one at a time; its expiry renewed while it follows)"),
    (REMOTE_DATASETS, "the Kaggle datasets tpuctl made for the cluster's runs (what `down` deletes there)"),
    (run_data("ID") + "...", "the run's own data ($TPUCTL_DATA_DIR): copies of blobs, frozen at submit"),
    (run_output("ID") + "/", "the job's outputs: checkpoints, TensorBoard events ($TPUCTL_OUTPUT_DIR)"),
    (run_metrics("ID"), "latest step, metrics and their history, for `tpuctl jobs` (tpuctl.runtime writes it)"),
]


def describe() -> str:
    """The layout as docs/store.md shows it."""
    width = max(len(k) for k, _ in DESCRIBED)
    return "\n".join(f"{k:<{width}}  {what}" for k, what in DESCRIBED)

