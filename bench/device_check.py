"""One prepared accelerator check: the step benchmark and the three workload configs
(issue 13), sized to fit one device-machine call (at most 10 minutes; the stages take
420 s by default).

Two steps. Here, on a machine with the data and a package registry:

  python3 bench/device_check.py --prepare --data_dir=../shared/data

copies CIFAR-10 (the JPEG archive) and Tiny Shakespeare into ``.device/data`` and
downloads the wheels hfl needs that an accelerator image may lack (ml_collections,
tensorboardX; Python 3.12, no dependencies) into ``.device/whl``; ``.device/`` is
git-ignored and about 21 MB. Then, on the accelerator host, from the repository root
with ``.device`` next to it:

  python3 bench/device_check.py --out=$OUT [--peak_tflops=F] [--budget_s=420] \
      [--bench_models=cnn,...|transformer_large] [--bench_batch=256]

installs the wheels into /tmp/site (when ``.device/whl`` has any), then runs, each
under its share of the budget plus whatever the stages before it left unused:
  1. ``bench/step_throughput.py`` on the models of the three configs and the
     Fashion-MNIST CNN (``--bench_models``; ``transformer_large`` is the
     benchmark-only 12 x 768 transformer at sequence 512), on a ``--mesh`` of the
     host's devices (default 1,1: one GPU; XLA simulates several devices on CPU
     only), with the same global batch as the CPU tables (``--bench_batch``, 256);
  2. ``bench/max_pool.py`` (flax's pooling against ``hfl.models.max_pool_2x2``, which
     the CNNs use on every backend; its speed-up was measured on CPU only);
  3. ``main.py`` with ``configs/cifar10.py``, ``configs/shakespeare.py`` and
     ``configs/cifar10_resnet20.py``, on the same mesh with each config's global
     batch (mesh.num_dcs x mesh.workers_per_dc x train.batch_size) on it, data
     from ``.device/data``. A config that outlasts its share is stopped; its
     evaluations so far are what it reports.
With ``--sweep=configs/sweeps/NAME.py`` it runs that sweep instead of the stages
(``python -m hfl.sweep``, the whole budget; on one device ``mesh.simulate='auto'`` runs
each config's D x W hierarchy vmapped, so the 4-DC semi-sync comparisons run there
unchanged), with the data from ``.device/data`` at the paths the configs name
(``../shared/data/...``, linked when absent), and returns every run in the results
archive's layout: ``runs/NAME/<run>/{config,summary}.json`` and ``metrics.jsonl``
(finished runs; copy them into ``docs/results/runs/NAME`` for the page), plus
``partial/NAME/<run>/metrics.jsonl`` of runs the budget stopped.
With ``--step_check`` it runs issue 52's accelerator check instead (the whole budget,
shares :data:`STEP_SHARES`): the step benchmark as in stage 1 (hierarchical / data
parallel with a round every iteration and at K = 4, MFU with ``--peak_tflops``), the
same for ``transformer_large`` at global batch :data:`LARGE_BATCH`, ``bench/trace_step.py``
(each program's GPU kernels and memsets per step, against the 872 of the hierarchical
transformer step before issue 52, docs/benchmarks.md), then two hierarchies trained in
the one-device mode (``mesh.simulate=vmap``): ``configs/default.py``'s 2 DCs x 4
workers on Fashion-MNIST, and ``configs/cifar10.py`` as semi_sync on 4 DCs x 2 workers
at speeds 3 : 2 : 1.5 : 1 (configs/sweeps/workloads.py's heterogeneous setting).
``--prepare`` copies Fashion-MNIST's IDX files too where ``--fmnist_dir`` has them.
What comes back (in ``--out``, two files): ``device_check.md`` (the host, the
benchmark table, and per config the iteration of its last evaluation, steps/s, that
evaluation and whether it finished; rewritten after every stage, so a call cut short
still returns what was done) and ``device_check.tar.gz`` (every run's
``metrics.jsonl`` and ``summary.json``, and each stage's output, ``<stage>.out``).
The default budget (420 s) leaves room in a 15-minute device lease for the machine's
start and one rerun. Exit status 1 when a stage failed or was stopped.

On a 1 x 1 mesh a config's hierarchy is trivial (one DC, one worker: every round
averages one model), so its accuracy is that of large-batch training with the
config's optimizer and schedule, not of the 2 x 4 experiment; the point is that the
same code runs unchanged on the accelerator, and how fast.
"""

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)
from hfl import mesh as mesh_lib, metrics as metrics_lib  # noqa: E402  pylint: disable=g-import-not-at-top
DEVICE_DIR = os.path.join(REPO, '.device')
DATA_FILES = {'cifar10': 'cifar10-jpeg.tar.gz', 'shakespeare': 'tinyshakespeare.txt'}
FMNIST_DIR = 'fashion-mnist'  # under .device/data: the four IDX files of Fashion-MNIST
FMNIST_FILES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
                't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')
WHEELS = ['ml_collections==1.1.0', 'tensorboardX==2.6.5']
CONFIGS = [('cifar10', 'cifar10'), ('shakespeare', 'shakespeare'),
           ('cifar10_resnet20', 'cifar10')]  # (config, its data file's key)
BENCH_MODELS = 'cnn,cifar_cnn,resnet20,transformer'
# Shares of --budget_s: the step benchmark, the pooling benchmark, then each config in
# CONFIGS' order.
SHARES = (0.25, 0.06, 0.21, 0.21, 0.27)
MAX_BUDGET_S = 560.0  # one device command runs for at most 600 s
WORK_DIR = '/tmp/hfl_device_check'  # the stages' runs and logs (emptied at each start)
# --step_check: shares of --budget_s for the step benchmark, transformer_large's, the
# trace, and the two one-device hierarchies.
STEP_SHARES = (0.22, 0.18, 0.14, 0.2, 0.26)
LARGE_BATCH = 32  # transformer_large's global batch (fits an 80 GB GPU, docs/benchmarks.md)


LARGE_MODEL = 'transformer_large'
TRACE_MODELS = 'transformer,cnn'


def hierarchy_runs() -> list[tuple[str, str, str, list[str]]]:
  """--step_check's one-device trainings: (name, config, its data under .device,
  main.py flags beyond them), each with ``mesh.simulate=vmap``."""
  from configs.sweeps import workloads  # pylint: disable=g-import-not-at-top
  semi = [f'--config.{k}={v}' for k, v in workloads.HETEROGENEOUS.items()]
  data = os.path.join(DEVICE_DIR, 'data')
  return [('default_2x4', 'default', os.path.join(data, FMNIST_DIR),
           ['--config.mesh.simulate=vmap']),
          ('cifar10_semisync_4x2', 'cifar10', os.path.join(data, DATA_FILES['cifar10']),
           ['--config.mesh.simulate=vmap', '--config.sync.strategy=semi_sync', *semi])]


def check_data_dir(data_dir: str) -> None:
  """Checks that ``data_dir`` is a directory holding every file of :data:`DATA_FILES`,
  readable, before ``--prepare`` writes anything.

  Raises:
    ValueError: one line naming ``--data_dir``, the path and what is wrong with it
      (does not exist, is not a directory, a file missing, not a file or unreadable).
  """
  needs = ', '.join(DATA_FILES.values())
  if not os.path.isdir(data_dir):
    what = 'is not a directory' if os.path.exists(data_dir) else 'does not exist'
    raise ValueError(f'--data_dir={data_dir} {what}; pass the directory holding {needs}')
  problems = []
  for name in DATA_FILES.values():
    src = os.path.join(data_dir, name)
    if not os.path.exists(src):
      problems.append(f'{src} does not exist')
    elif not os.path.isfile(src):
      problems.append(f'{src} is not a file')
    elif not os.access(src, os.R_OK):
      problems.append(f'{src} is not readable')
  if problems:
    raise ValueError(f'--data_dir={data_dir}: {"; ".join(problems)} (--prepare needs {needs} '
                     'there)')


def prepare(data_dir: str, python_version: str, fmnist_dir: str | None = None) -> None:
  """Fills ``.device/`` (data and wheels; Fashion-MNIST's IDX files from ``fmnist_dir``
  where it holds all four, for ``--step_check``); ValueError from :func:`check_data_dir`
  for a bad ``data_dir``, before anything is written."""
  check_data_dir(data_dir)
  os.makedirs(os.path.join(DEVICE_DIR, 'data'), exist_ok=True)
  copies = [(os.path.join(data_dir, n), os.path.join(DEVICE_DIR, 'data', n))
            for n in DATA_FILES.values()]
  if fmnist_dir and all(os.path.isfile(os.path.join(fmnist_dir, n)) for n in FMNIST_FILES):
    os.makedirs(os.path.join(DEVICE_DIR, 'data', FMNIST_DIR), exist_ok=True)
    copies += [(os.path.join(fmnist_dir, n), os.path.join(DEVICE_DIR, 'data', FMNIST_DIR, n))
               for n in FMNIST_FILES]
  elif fmnist_dir:
    print(f'warning: --fmnist_dir={fmnist_dir} lacks Fashion-MNIST\'s IDX files '
          f'({", ".join(FMNIST_FILES)}); --step_check will need them', file=sys.stderr)
  for src, dst in copies:
    if os.path.exists(dst):
      os.remove(dst)
    shutil.copyfile(src, dst)
  whl = os.path.join(DEVICE_DIR, 'whl')
  shutil.rmtree(whl, ignore_errors=True)  # one version of each wheel
  os.makedirs(whl)
  cmd = [sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--only-binary=:all:',
         '--python-version', python_version, '--implementation', 'cp', '-d', whl, *WHEELS]
  subprocess.run(cmd, check=True)
  size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(DEVICE_DIR, '**'),
                                                    recursive=True) if os.path.isfile(f))
  print(f'{DEVICE_DIR}: {size / 1e6:.1f} MB (data: {", ".join(DATA_FILES.values())}; wheels: '
        f'{", ".join(sorted(os.listdir(whl)))}); carry ".device" to the accelerator host')


def _env() -> dict:
  env = dict(os.environ, PYTHONUNBUFFERED='1', HFL_CACHE_DIR='/tmp/hfl_cache')
  wheels = glob.glob(os.path.join(DEVICE_DIR, 'whl', '*.whl'))
  if wheels:
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
                    '--no-compile', '--upgrade', '--target', '/tmp/site', *wheels], check=True)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, ['/tmp/site', env.get('PYTHONPATH')]))
    sys.path.insert(0, '/tmp/site')  # this process reads the configs too (overrides)
  return env


def _run(cmd, log_path: str, timeout_s: float, env) -> tuple[int | None, float]:
  """Runs ``cmd`` with its output in ``log_path``: (exit status or None on timeout, s)."""
  t0 = time.time()
  with open(log_path, 'w') as log:
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
      rc = p.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, 9)
      p.wait()
      rc = None
  return rc, time.time() - t0


def overrides(config: str, d: int, w: int, num_steps: int = 0) -> list[str]:
  """main.py flags that run ``configs/<config>.py`` on a d x w mesh at the config's
  global batch, with uniform DC speeds; ``num_steps`` > 0 shortens the run (the warm-up
  then at most a tenth of it)."""
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_file(os.path.join(REPO, 'configs', config + '.py'))
  batch = c.mesh.num_dcs * c.mesh.workers_per_dc * c.train.batch_size
  flags = [f'--config.mesh.num_dcs={d}', f'--config.mesh.workers_per_dc={w}',
           f'--config.network.dc_speed={(1.0,) * d}',
           f'--config.train.batch_size={max(1, batch // (d * w))}']
  return flags + shorten(c, num_steps)


def shorten(c, num_steps: int) -> list[str]:
  """main.py flags that stop config ``c`` after ``num_steps`` iterations (none for 0),
  its warm-up then at most a tenth of them."""
  if not num_steps:
    return []
  return [f'--config.train.num_steps={num_steps}',
          f'--config.optimizer.warmup_steps={min(c.optimizer.warmup_steps, num_steps // 10)}']


def _open_report(out: str, work: str, lines: list) -> dict:
  """The stages' environment (:func:`_env`); appends the host's line to ``lines`` and
  saves the report."""
  env = _env()
  lines += [_host_line(env), '']
  _save(out, work, lines)
  return env


def _failed(lines: list, e: Exception) -> bool:
  """Records in ``lines`` that the check itself raised ``e``; returns False (not ok)."""
  lines += ['', f'**The check itself failed**: {type(e).__name__}: {e}']
  return False


def _close_report(out: str, work: str, lines: list, ok: bool) -> int:
  """Saves and prints the report; the exit status: 0 when ``ok``, else 1."""
  _save(out, work, lines)
  print('\n'.join(lines))
  return 0 if ok else 1


def _host_line(env) -> str:
  info = subprocess.run([sys.executable, '-c', 'import jax; print(jax.__version__, '
                         'jax.default_backend(), jax.device_count(), '
                         'jax.devices()[0].device_kind)'],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
  return f'jax, backend, devices, kind: `{(info.stdout or info.stderr).strip()}`'


def _command_stage(cmd: list, log_path: str, allowed: float, env, keep) -> tuple:
  """Runs a benchmark command for at most ``allowed`` s: (rc or None, wall s, the
  report's lines: the command, then the lines of its output that ``keep`` accepts)."""
  rc, wall = _run(cmd, log_path, allowed, env)
  lines = [f'`{" ".join(cmd[1:])}` ({"exit " + str(rc) if rc is not None else "stopped"}, '
           f'{wall:.0f} s):', '']
  with open(log_path) as f:
    lines += [l.rstrip() for l in f if keep(l)]
  return rc, wall, lines


def _bench_cmd(models: str, mesh: str, batch: int, steps: int, blocks: int,
               peak_tflops: float | None) -> list:
  cmd = [sys.executable, 'bench/step_throughput.py', f'--model={models}', f'--mesh={mesh}',
         f'--batch={batch}', f'--steps={steps}', f'--blocks={blocks}']
  return cmd + ([f'--peak_tflops={peak_tflops}'] if peak_tflops else [])


def _bench_lines(line: str) -> bool:
  return line.startswith(('|', 'peak', 'allocator'))


def _config_row(name: str, workdir: str, rc, wall_s: float) -> str:
  try:
    recs = metrics_lib.read_jsonl(os.path.join(workdir, 'metrics.jsonl'), strict=False)
  except (OSError, ValueError) as e:
    return f'| {name} | metrics.jsonl unreadable: {e} | – | – | – | {wall_s:.0f} |'
  done = os.path.exists(os.path.join(workdir, 'summary.json'))
  state = 'finished' if done else ('stopped at its share of the budget' if rc is None
                                   else f'failed (exit {rc}; see {name}.out)')
  if not recs:
    return f'| {name} | {state} | – | – | – | {wall_s:.0f} |'
  last = recs[-1]
  metric = (f'val loss {last["test_loss"]:.4f} nats/char' if 'test_bits_per_char' in last
            else f'test acc {last["test_accuracy"]:.2%}')
  rate = last['step'] / last['wall_time_s'] if last.get('wall_time_s') else float('nan')
  return (f'| {name} | {state} | {last["step"]} | {rate:.1f} | {metric} | {wall_s:.0f} |')


RUN_TABLE = ['| {} | state | iteration of the last evaluation | steps/s (incl. compile, evals) '
             '| last evaluation | wall s |', '|---|---|---:|---:|---|---:|']


def _train(name: str, config: str, flags: list, data_dir: str, allowed: float, env, out: str,
           work: str, lines: list) -> tuple:
  """Trains ``configs/<config>.py`` with main.py ``flags`` on ``data_dir`` in workdir
  ``work``/``name`` for at most ``allowed`` s, appends its row to ``lines`` and saves
  the report: (rc or None, s)."""
  cmd = [sys.executable, 'main.py', f'--config=configs/{config}.py',
         f'--workdir={os.path.join(work, name)}', *flags, f'--config.dataset.data_dir={data_dir}']
  rc, wall = _run(cmd, os.path.join(work, name + '.out'), allowed, env)
  lines.append(_config_row(name, os.path.join(work, name), rc, wall))
  print(lines[-1], flush=True)
  _save(out, work, lines)
  return rc, wall


def _fresh_work(out: str) -> str:
  """Makes ``out`` and an empty scratch directory for the stages' runs and logs;
  returns the latter."""
  os.makedirs(out, exist_ok=True)
  work = WORK_DIR
  shutil.rmtree(work, ignore_errors=True)
  os.makedirs(work)
  return work


def _save(out: str, work: str, lines: list) -> None:
  """Writes ``out``/device_check.md and the tarball of what ``work`` holds so far."""
  with open(os.path.join(out, 'device_check.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  with tarfile.open(os.path.join(out, 'device_check.tar.gz'), 'w:gz') as tar:
    for f in sorted(glob.glob(os.path.join(work, '*'))):
      if os.path.isdir(f):
        for name in ('metrics.jsonl', 'summary.json'):
          if os.path.exists(os.path.join(f, name)):
            tar.add(os.path.join(f, name), arcname=os.path.join(os.path.basename(f), name))
      else:
        tar.add(f, arcname=os.path.basename(f))


def link_data(data_root: str | None = None) -> list[str]:
  """Makes the configs' data paths (``../shared/data/<file>`` from the repository root,
  or ``data_root``) point at ``.device/data`` where they do not exist; returns the links
  made. OSError when the directory cannot be created."""
  data_root = data_root or os.path.normpath(os.path.join(REPO, '..', 'shared', 'data'))
  made = []
  for name in DATA_FILES.values():
    dst, src = os.path.join(data_root, name), os.path.join(DEVICE_DIR, 'data', name)
    if not os.path.exists(dst) and os.path.exists(src):
      os.makedirs(data_root, exist_ok=True)
      if os.path.lexists(dst):
        os.remove(dst)  # a dangling link
      os.symlink(src, dst)
      made.append(dst)
  return made


def _copy_runs(root: str, out: str, name: str) -> list[str]:
  """Copies each run of sweep ``root`` into ``out``: finished ones (summary.json) as
  ``runs/NAME/<run>/`` with config.json, summary.json and metrics.jsonl, the others'
  metrics.jsonl as ``partial/NAME/<run>/``. Returns table rows, one per run."""
  rows = []
  for run in metrics_lib.manifest_runs(root) or []:
    src = os.path.join(root, run)
    done = os.path.exists(os.path.join(src, 'summary.json'))
    dst = os.path.join(out, 'runs' if done else 'partial', name, run)
    for f in ('config.json', 'summary.json', 'metrics.jsonl') if done else ('metrics.jsonl',):
      if os.path.exists(os.path.join(src, f)):
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
    recs = (metrics_lib.read_jsonl(os.path.join(src, 'metrics.jsonl'), strict=False)
            if os.path.exists(os.path.join(src, 'metrics.jsonl')) else [])
    evals = [r for r in recs if 'test_loss' in r]
    last = (f'{evals[-1]["step"]}: loss {evals[-1]["test_loss"]:.4f}' +
            (f', acc {evals[-1]["test_accuracy"]:.2%}' if 'test_accuracy' in evals[-1] else '')
            if evals else '–')
    rows.append(f'| {run} | {"finished" if done else "not finished"} | {last} |')
  return rows


def check_sweep(out: str, sweep: str, budget_s: float) -> int:
  """Runs sweep file ``sweep`` for at most ``budget_s`` seconds and copies its runs into
  ``out`` (:func:`_copy_runs`); writes ``out``/device_check.md. Returns 0 when every run
  finished, else 1."""
  name = os.path.splitext(os.path.basename(sweep))[0]
  work = _fresh_work(out)
  root = os.path.join(work, name)
  lines = ['# hfl device check: sweep', '']
  try:
    env = _env()
    links = link_data()
    cmd = [sys.executable, '-m', 'hfl.sweep', f'--sweep={sweep}', f'--root={root}',
           '--no_report']
    rc, wall = _run(cmd, os.path.join(work, 'sweep.out'), budget_s, env)
    rows = _copy_runs(root, out, name)
    lines += [f'`{" ".join(cmd[1:])}` ({"exit " + str(rc) if rc is not None else "stopped"}, '
              f'{wall:.0f} s; data linked: {", ".join(links) or "none"})', '',
              '| run | state | last evaluation (iteration: metrics) |', '|---|---|---|', *rows]
    ok = rc == 0 and rows and all('| finished |' in r for r in rows)
  except Exception as e:  # pylint: disable=broad-except
    ok = _failed(lines, e)
  return _close_report(out, work, lines, ok)


def check(out: str, mesh: str, budget_s: float, peak_tflops: float | None,
          num_steps: int = 0, bench_models: str = BENCH_MODELS,
          bench_batch: int = 256) -> int:
  """Runs the benchmark (of ``bench_models`` at global batch ``bench_batch``) and the
  configs; writes ``out``/device_check.{md,tar.gz} after every stage. Returns 0, or 1
  when a stage failed or was stopped."""
  work = _fresh_work(out)
  d, w = mesh_lib.parse_shape(mesh)
  lines = ['# hfl device check', '']
  ok = True
  try:
    env = _open_report(out, work, lines)
    deadline = time.time() + budget_s
    spare = 0.0  # seconds the stages before left unused
    cmd = _bench_cmd(bench_models, mesh, max(1, bench_batch // (d * w)), 20, 5, peak_tflops)
    allowed = SHARES[0] * budget_s
    rc, wall, got = _command_stage(cmd, os.path.join(work, 'bench.out'), allowed, env,
                                   _bench_lines)
    spare, ok = max(0.0, allowed - wall), ok and rc == 0
    lines += got
    cmd = [sys.executable, 'bench/max_pool.py', '--calls=20', '--blocks=3']
    allowed = SHARES[1] * budget_s + spare
    pool_log = os.path.join(work, 'max_pool.out')
    rc, wall = _run(cmd, pool_log, allowed, env)
    spare, ok = max(0.0, allowed - wall), ok and rc == 0
    lines += ['', f'`{" ".join(cmd[1:])}` ({"exit " + str(rc) if rc is not None else "stopped"}, '
              f'{wall:.0f} s):', '']
    with open(pool_log) as f:
      lines += [l.rstrip() for l in f if l.startswith('|')]
    lines += ['', RUN_TABLE[0].format('config'), RUN_TABLE[1]]
    _save(out, work, lines)
    for (config, data), share in zip(CONFIGS, SHARES[2:]):
      allowed = min(share * budget_s + spare, deadline - time.time())
      rc, wall = _train(config, config, overrides(config, d, w, num_steps),
                        os.path.join(DEVICE_DIR, 'data', DATA_FILES[data]), allowed, env, out,
                        work, lines)
      spare, ok = max(0.0, allowed - wall), ok and rc == 0
  except Exception as e:  # pylint: disable=broad-except
    ok = _failed(lines, e)
  lines += ['', f'Mesh {d}x{w}, each config at its own global batch; commands: see '
            'bench/device_check.py.']
  return _close_report(out, work, lines, ok)


def check_step(out: str, budget_s: float, peak_tflops: float | None, num_steps: int = 0,
               bench_models: str = BENCH_MODELS, bench_batch: int = 256) -> int:
  """Issue 52's accelerator check on one device (module docstring, ``--step_check``):
  the step benchmark of ``bench_models`` at global batch ``bench_batch`` and of
  ``transformer_large``, the kernel trace, and :func:`hierarchy_runs` in the one-device
  mode (``num_steps`` > 0 shortens them). Writes ``out``/device_check.{md,tar.gz} after
  every stage; returns 0, or 1 when a stage failed or was stopped."""
  from hfl import config as config_lib  # pylint: disable=g-import-not-at-top
  work = _fresh_work(out)
  lines = ['# hfl device check: the accelerator step (issue 52)', '']
  ok = True
  try:
    env = _open_report(out, work, lines)
    deadline = time.time() + budget_s
    spare = 0.0
    trace = lambda l: l.strip() and not l.startswith('    ')  # its summary, not its top ops
    stages = [
        ('bench', _bench_cmd(bench_models, '1,1', bench_batch, 20, 5, peak_tflops), _bench_lines),
        ('bench_large', _bench_cmd(LARGE_MODEL, '1,1', LARGE_BATCH, 5, 3, peak_tflops),
         _bench_lines),
        ('trace', [sys.executable, 'bench/trace_step.py', f'--model={TRACE_MODELS}',
                   '--mesh=1,1', f'--batch={bench_batch}', '--steps=10', '--blocks=3',
                   f'--out={os.path.join(work, "trace")}'], trace)]
    for (name, cmd, keep), share in zip(stages, STEP_SHARES):
      allowed = min(share * budget_s + spare, deadline - time.time())
      rc, wall, got = _command_stage(cmd, os.path.join(work, name + '.out'), allowed, env, keep)
      spare, ok = max(0.0, allowed - wall), ok and rc == 0
      lines += (got if name != 'trace' else got[:2] + ['```'] + got[2:] + ['```']) + ['']
      _save(out, work, lines)
    lines += ['One-device mode (`mesh.simulate=vmap`): each hierarchy at its own D x W.', '',
              RUN_TABLE[0].format('run'), RUN_TABLE[1]]
    for (name, config, data, flags), share in zip(hierarchy_runs(), STEP_SHARES[3:]):
      c = config_lib.load_file(os.path.join(REPO, 'configs', config + '.py'))
      allowed = min(share * budget_s + spare, deadline - time.time())
      rc, wall = _train(name, config, [*flags, *shorten(c, num_steps)], data, allowed, env, out,
                        work, lines)
      spare, ok = max(0.0, allowed - wall), ok and rc == 0
  except Exception as e:  # pylint: disable=broad-except
    ok = _failed(lines, e)
  return _close_report(out, work, lines, ok)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--prepare', action='store_true', help='fill .device/ (here, not there)')
  ap.add_argument('--data_dir', default=os.path.join(REPO, '..', 'shared', 'data'))
  ap.add_argument('--python_version', default='3.12', help='of the accelerator host')
  ap.add_argument('--out', default=os.environ.get('OUT', '/tmp/hfl_device_out'))
  ap.add_argument('--mesh', default='1,1', help='D,W on the host\'s devices')
  ap.add_argument('--budget_s', type=float, default=420.0,
                  help=f'wall seconds for the stages, (0, {MAX_BUDGET_S:.0f}] (shares: {SHARES})')
  ap.add_argument('--peak_tflops', type=float, default=None,
                  help='the chip\'s dense TF32 peak (JAX runs f32 matmuls in TF32 on GPUs)')
  ap.add_argument('--num_steps', type=int, default=0,
                  help="iterations per config (0: the config's train.num_steps)")
  ap.add_argument('--sweep', default=None,
                  help='a sweep file to run instead of the stages (its runs come back in '
                  'the results archive\'s layout)')
  ap.add_argument('--bench_models', default=BENCH_MODELS,
                  help='models of the step benchmark (bench/step_throughput.py --model), e.g. '
                       'transformer_large, the benchmark-only 12 x 768 transformer at sequence '
                       '512 (with --bench_batch=32 it fits an 80 GB GPU)')
  ap.add_argument('--step_check', action='store_true',
                  help='issue 52\'s accelerator check instead of the stages (module docstring)')
  ap.add_argument('--fmnist_dir', default='/usr/share/datasets/fashion-mnist',
                  help='Fashion-MNIST\'s IDX files, copied by --prepare for --step_check')
  ap.add_argument('--bench_batch', type=int, default=256,
                  help='global batch of the step benchmark (split over the mesh)')
  args = ap.parse_args(argv)
  if args.prepare:
    try:
      check_data_dir(args.data_dir)
    except ValueError as e:
      ap.error(str(e))
    prepare(args.data_dir, args.python_version, args.fmnist_dir)
    return 0
  try:
    mesh_lib.parse_shape(args.mesh)
  except ValueError as e:
    ap.error(str(e))
  if not 0 < args.budget_s <= MAX_BUDGET_S:
    ap.error(f'--budget_s must be in (0, {MAX_BUDGET_S:.0f}] seconds, got {args.budget_s}')
  if args.num_steps < 0:
    ap.error(f'--num_steps must be >= 0 (0: the config\'s), got {args.num_steps}')
  if args.bench_batch < 1:
    ap.error(f'--bench_batch must be >= 1, got {args.bench_batch}')
  if args.peak_tflops is not None and not args.peak_tflops > 0:
    ap.error(f'--peak_tflops must be > 0, got {args.peak_tflops}')
  missing = [n for n in DATA_FILES.values()
             if not os.path.exists(os.path.join(DEVICE_DIR, 'data', n))]
  missing += [f'whl/{n.split("==")[0]}' for n in WHEELS
              if importlib.util.find_spec(n.split('==')[0]) is None
              and not glob.glob(os.path.join(DEVICE_DIR, 'whl', n.split('==')[0].lower() + '-*'))]
  if args.step_check and not all(os.path.exists(os.path.join(DEVICE_DIR, 'data', FMNIST_DIR, n))
                                 for n in FMNIST_FILES):
    missing.append(f'data/{FMNIST_DIR} (Fashion-MNIST, for --step_check; --fmnist_dir)')
  if missing:
    ap.error(f'{DEVICE_DIR} lacks {", ".join(missing)}: run --prepare first (and carry '
             '.device)')
  if args.sweep:
    if not os.path.isfile(os.path.join(REPO, args.sweep)):
      ap.error(f'--sweep={args.sweep} is not a file (give e.g. '
               'configs/sweeps/cifar10_semisync.py, relative to the repository root)')
    return check_sweep(args.out, args.sweep, args.budget_s)
  if args.step_check:
    return check_step(args.out, args.budget_s, args.peak_tflops, args.num_steps,
                      args.bench_models, args.bench_batch)
  return check(args.out, args.mesh, args.budget_s, args.peak_tflops, args.num_steps,
               args.bench_models, args.bench_batch)


if __name__ == '__main__':
  sys.exit(main())
