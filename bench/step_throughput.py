"""Steps/s of the hierarchical step vs data parallelism vs one device, and the model
FLOPs utilisation (MFU) against this CPU's peak.

For each model, three programs train the same model on the same global batch
(D x W workers x --batch examples) with SGD, timed in alternating blocks in one
process (medians; quote the ratios: hier. / DP is the median, with its quartiles, of the
per-block ratios of adjacent blocks, robust to the shared machine's speed drifting):
  * hierarchical: hfl.step with do_round=True every iteration (intra-DC all-reduce
    over 'worker', optimizer on the workers, inter-DC all-gather of the
    pseudo-gradient over 'dc', outer averaging): the synchronous HPS baseline;
  * hierarchical K: the same step with a round every --k iterations (default 4, the
    default config's sync.k: K - 1 intra-DC iterations, then one with a round),
    what a default experiment runs;
  * data parallel: one shard_map'd step, gradient pmean over ('dc', 'worker'),
    optax update;
  * two-level floor: the least any hierarchical step with a round every iteration
    runs: per-DC parameters (sharded over 'dc', like hfl's), each worker's gradient
    pmean'd over 'worker' and then over 'dc' (two dependent collectives instead of
    data parallelism's one), optax update; no pseudo-gradient, outer optimizer,
    WAN split, finiteness flags or accounting. "hier. / floor" is how far hfl's
    step is from it, "floor / DP" what the second collective level alone costs;
  * one device: plain jax.jit of the same SGD step on the whole global batch on
    device 0 (no mesh, no collectives).

Model FLOPs per step are counted from the program (the jaxpr of the global-batch
loss and gradient: 2 x multiply-adds of every dot_general and convolution, i.e.
the matmul/conv work of forward and backward passes, nothing else) and
cross-checked against XLA's cost analysis of the compiled programs (which also
counts elementwise work: the hierarchical step's SPMD program reports one
device's share, multiplied here by the device count). MFU = model FLOPs/step x
steps/s / peak, peak from bench/flops.py (lscpu and /proc/cpuinfo: cores x clock x
fp32 lanes x FMA units x 2).

Inputs are synthetic, shaped like each model's data: the dataset of the first
config in configs/ that uses the model (28x28x1 for Fashion-MNIST/MNIST, 32x32x3
for CIFAR), float32 images with int labels; a token model (``seq_len``/
``vocab_size`` attributes, or hfl.models.input_kind) gets int32 token windows
[B, seq_len] with next-token labels.

A benchmark-only size, transformer_large (12 layers x 768 wide, sequence 512,
synthetic tokens; :data:`BENCH_ONLY`), is selected by name and never by ``all``.

  python3 bench/step_throughput.py [--model=cnn[,mlp,...]|all] [--steps=30] \
      [--blocks=4] [--batch=32] [--k=4] [--mesh=2,4] [--fma_units=N] [--clock_ghz=F] \
      [--peak_tflops=F]

On one GPU: --mesh=1,1 (XLA simulates several devices on CPU only), --batch=256 for the
same global batch, and --peak_tflops for its MFU (bench/device_check.py does this).
"""

import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hfl import runtime  # noqa: E402

runtime.use_fast_allocator()  # re-exec once with tcmalloc (docs/benchmarks.md)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from hfl import config as config_lib, mesh as mesh_lib, models, step as step_lib  # noqa: E402
from hfl.compress import base  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flops import jaxpr_flops, this_cpu_peak_flops, xla_cost, xla_flops  # noqa: E402
import arg_types  # noqa: E402
from arg_types import int_at_least, number_in  # noqa: E402

# Per-example image shapes of the datasets hfl reads (HWC).
IMAGE_SHAPES = {'fashion_mnist': (28, 28, 1), 'mnist': (28, 28, 1), 'cifar10': (32, 32, 3),
                'cifar100': (32, 32, 3), 'svhn_cropped': (32, 32, 3)}
DEFAULT_VOCAB = 65  # Tiny Shakespeare's characters
# Benchmark-only model sizes, outside hfl.models.MODELS so that no config can train
# them: name -> (the hfl.models name it is built with, its options).
# transformer_large: GPT-2 small's shape (12 layers, 12 heads, width 768) at sequence
# 512 with the character vocabulary: 85.5M parameters in 198 leaves, 0.29 TFLOP (the
# matmuls of forward and backward) per 512-token window. Big enough for a GPU to spend
# its time computing; on a 2-core CPU one example per worker runs a few steps
# (--mesh=1,1 --batch=1 --steps=1 --blocks=1).
BENCH_ONLY = {'transformer_large': ('transformer', dict(num_layers=12, num_heads=12,
                                                        embed_dim=768, seq_len=512))}
CHOICES = tuple(models.MODELS) + tuple(BENCH_ONLY)


def get_model(name: str):
  """(the Flax module of ``name``, one of :data:`CHOICES`; whether it reads tokens): a
  token model with the character vocabulary (:data:`DEFAULT_VOCAB`), an image model
  with 10 classes."""
  base, opts = BENCH_ONLY.get(name, (name, {}))
  tokens = models.input_kind(base) == 'tokens'
  return models.get_model(base, DEFAULT_VOCAB if tokens else 10, **opts), tokens


# ------------------------------------------------------------------------------
# Models and inputs.
# ------------------------------------------------------------------------------

def model_dataset(name: str) -> str | None:
  """The dataset of the first config in configs/ (sorted, default.py first) using ``name``."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
  files = sorted(glob.glob(os.path.join(root, '*.py')), key=lambda f: (
      not f.endswith('default.py'), f))
  for f in files:
    try:
      c = config_lib.load_file(f)
    except Exception:  # pylint: disable=broad-except
      continue
    if c.get('model', {}).get('name') == name:
      return c.dataset.name
  return None


def build(name: str, batch: int, rng, d: int = 2, w: int = 4):
  """(net, global inputs x [d, w, B, ...], labels y [d, w, B(, T)], description) of
  model ``name`` (:data:`CHOICES`)."""
  net, tokens = get_model(name)
  if tokens:
    t, v = int(getattr(net, 'seq_len', 64)), int(getattr(net, 'vocab_size', DEFAULT_VOCAB))
    tokens = rng.integers(0, v, size=(d, w, batch, t + 1)).astype(np.int32)
    return net, tokens[..., :-1], tokens[..., 1:], f'int32 tokens [{t}], vocab {v}'
  dataset = model_dataset(name) or 'fashion_mnist'
  shape = IMAGE_SHAPES.get(dataset, (28, 28, 1))
  x = rng.normal(size=(d, w, batch) + shape).astype(np.float32)
  y = rng.integers(0, 10, size=(d, w, batch)).astype(np.int32)
  return net, x, y, f'{dataset} {"x".join(map(str, shape))}'


# ------------------------------------------------------------------------------
# The three programs.
# ------------------------------------------------------------------------------

def hierarchical(apply_fn, params, opt, mesh):
  """(hfl's step with identity compressors on every link and ``opt`` on the workers,
  outer SGD(1) (averaging), its initial state placed on ``mesh``)."""
  ident = [base.identity(l.shape) for l in jax.tree.leaves(params)]
  comps = step_lib.Compressors(ident, ident, ident)
  D, W = mesh.shape['dc'], mesh.shape['worker']  # pylint: disable=invalid-name
  state = step_lib.init_state(params, opt, optax.sgd(1.0), comps, D, W, jax.random.PRNGKey(1))
  state = jax.device_put(state, step_lib.state_shardings(mesh, state))
  return step_lib.make_step(apply_fn, opt, optax.sgd(1.0), comps, mesh, state), state


def data_parallel(loss_fn, opt, mesh):
  """The plain data-parallel step, jitted: ``(params, opt_state, x, y) -> (params,
  opt_state)`` with replicated params and optimizer state (donated), inputs
  [D, W, B, ...] sharded P('dc', 'worker'), one gradient pmean over both axes."""
  def dp_body(p, o, x, y):
    p_var = jax.lax.pcast(p, ('dc', 'worker'), to='varying')
    g = jax.grad(loss_fn)(p_var, x[0, 0], y[0, 0])
    g = jax.lax.pmean(g, ('dc', 'worker'))
    u, o = opt.update(g, o, p)
    return optax.apply_updates(p, u), o
  return jax.jit(jax.shard_map(dp_body, mesh=mesh,
                               in_specs=(P(), P(), P('dc', 'worker'), P('dc', 'worker')),
                               out_specs=(P(), P())), donate_argnums=(0, 1))


def programs(net, x_host, y_host, mesh, k: int = 4):
  """Returns {name: (run(n) -> None, xla FLOPs/step)}, the model FLOPs/step and the
  MB each device's program reads and writes per step (XLA's "bytes accessed":
  hierarchical, data parallel). The mesh is ``mesh``'s ('dc', 'worker') shape."""
  D, W = mesh.shape['dc'], mesh.shape['worker']  # pylint: disable=invalid-name
  x0 = jnp.asarray(x_host[0, 0, :1])
  params = net.init(jax.random.PRNGKey(0), x0)['params']
  apply_fn = lambda p, x: net.apply({'params': p}, x)
  opt = optax.sgd(0.05)

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y).mean()

  gx = x_host.reshape((-1,) + x_host.shape[3:])
  gy = y_host.reshape((-1,) + y_host.shape[3:])
  model_flops = jaxpr_flops(jax.make_jaxpr(jax.value_and_grad(loss_fn))(params, gx, gy))

  # ---- Hierarchical step.
  hstep, state = hierarchical(apply_fn, params, opt, mesh)
  bsh = NamedSharding(mesh, P('dc', 'worker'))
  rep = NamedSharding(mesh, P())
  x, y = jax.device_put(x_host, bsh), jax.device_put(y_host, bsh)
  active = jax.device_put(np.ones(D, bool), NamedSharding(mesh, P('dc')))
  weights = jax.device_put(np.full(D, 1 / D, np.float32), rep)
  h_compiled = hstep.jitted[True].lower(state, x, y, active, weights).compile()
  h_flops = xla_flops(h_compiled) * D * W
  box = {'h': state}

  def run_h(n):
    for _ in range(n):
      box['h'], m = hstep(box['h'], (x, y), active, weights, True)
      jax.block_until_ready(m)

  box['hk'] = jax.tree.map(jnp.copy, state)

  def run_hk(n):  # whole rounds: n rounded up to a multiple of k, a round every k-th
    m = -(-n // k) * k
    for i in range(m):
      box['hk'], out = hstep(box['hk'], (x, y), active, weights, i % k == k - 1)
      jax.block_until_ready(out)
    return m

  # ---- Data-parallel step.
  dp = data_parallel(loss_fn, opt, mesh)
  box['dp'] = (jax.device_put(jax.tree.map(jnp.array, params), rep),
               jax.device_put(opt.init(params), rep))
  dp_compiled = dp.lower(*box['dp'], x, y).compile()
  dp_flops = xla_flops(dp_compiled) * D * W
  mb = tuple(xla_cost(c, 'bytes accessed') / 1e6 for c in (h_compiled, dp_compiled))

  def run_dp(n):
    for _ in range(n):
      box['dp'] = dp(*box['dp'], x, y)
      jax.block_until_ready(box['dp'])

  # ---- Two-level floor: per-DC parameters, pmean over 'worker' then over 'dc'.
  def floor_body(p, o, x, y):  # p, o: this DC's copy, leaves [1, ...]
    p_var = jax.lax.pcast(jax.tree.map(lambda a: a[0], p), 'worker', to='varying')
    g = jax.lax.pmean(jax.lax.pmean(jax.grad(loss_fn)(p_var, x[0, 0], y[0, 0]), 'worker'),
                      'dc')
    # The update in the stored [1, ...] layout: XLA then updates the donated buffers in
    # place (squeezing and re-adding the axis makes it copy them; no measurable cost here).
    u, o = jax.vmap(opt.update)(jax.tree.map(lambda a: a[None], g), o, p)
    return optax.apply_updates(p, u), o
  floor = jax.jit(jax.shard_map(floor_body, mesh=mesh,
                                in_specs=(P('dc'), P('dc'), P('dc', 'worker'), P('dc', 'worker')),
                                out_specs=(P('dc'), P('dc'))), donate_argnums=(0, 1))
  per_dc = lambda t: jax.tree.map(lambda a: np.broadcast_to(a, (D,) + a.shape).copy(),
                                  jax.tree.map(np.asarray, t))
  box['floor'] = jax.device_put(per_dc((params, opt.init(params))),
                                NamedSharding(mesh, P('dc')))
  floor_flops = xla_flops(floor.lower(*box['floor'], x, y).compile()) * D * W

  def run_floor(n):
    for _ in range(n):
      box['floor'] = floor(*box['floor'], x, y)
      jax.block_until_ready(box['floor'])

  # ---- One device, plain jax.jit, the global batch.
  dev = jax.devices()[0]

  def one_step(p, o, x, y):
    g = jax.grad(loss_fn)(p, x, y)
    u, o = opt.update(g, o, p)
    return optax.apply_updates(p, u), o
  one = jax.jit(one_step, donate_argnums=(0, 1))
  box['one'] = jax.device_put((jax.tree.map(jnp.array, params), opt.init(params)), dev)
  ox, oy = jax.device_put(gx, dev), jax.device_put(gy, dev)
  one_flops = xla_flops(one.lower(*box['one'], ox, oy).compile())

  def run_one(n):
    for _ in range(n):
      box['one'] = one(*box['one'], ox, oy)
      jax.block_until_ready(box['one'])

  progs = {'hierarchical': (run_h, h_flops), f'hierarchical K={k}': (run_hk, h_flops),
           'data parallel': (run_dp, dp_flops), 'two-level floor': (run_floor, floor_flops),
           'one device': (run_one, one_flops)}
  return progs, model_flops, mb


def measure(progs, steps: int, blocks: int) -> tuple[dict, dict]:
  """Median steps/s of each program over alternating blocks of ``steps`` steps (a
  program's run may return how many it ran instead: the K program runs whole rounds),
  after 2 warm-up steps, and the per-block ratios (each from adjacent blocks, so a slow drift of the shared
  machine's speed cancels): of every program but data parallelism and one device to
  data parallelism (steps/s over DP's), and 'hierarchical / floor' (the hierarchical
  step's steps/s over the two-level floor's) where both ran."""
  for run, _ in progs.values():
    run(2)
  times = {k: [] for k in progs}  # seconds per step, per block
  for _ in range(blocks):
    for k, (run, _) in progs.items():
      t0 = time.perf_counter()
      ran = run(steps) or steps
      times[k].append((time.perf_counter() - t0) / ran)
  ratios = {k: [d / h for h, d in zip(times[k], times['data parallel'])]
            for k in times if k not in ('data parallel', 'one device')}
  if 'hierarchical' in times and 'two-level floor' in times:
    ratios['hierarchical / floor'] = [f / h for h, f in zip(times['hierarchical'],
                                                             times['two-level floor'])]
  return {k: 1 / float(np.median(v)) for k, v in times.items()}, ratios


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  ap.add_argument('--model', default='cnn',
                  help=f'comma-separated models, each once ({", ".join(CHOICES)}), or all '
                       f'(those of hfl.models: {", ".join(models.MODELS)})')
  ap.add_argument('--steps', type=int_at_least(1), default=30,
                  help='steps per timed block (the K program: rounded up to whole rounds)')
  ap.add_argument('--blocks', type=int_at_least(1), default=4,
                  help='timed blocks of each program (alternating)')
  ap.add_argument('--batch', type=int_at_least(1), default=32, help='examples per worker')
  ap.add_argument('--k', type=int_at_least(1), default=4,
                  help='iterations per round of the "hierarchical K" program (>= 1)')
  ap.add_argument('--mesh', default='2,4',
                  help="D,W: DCs and workers per DC (D x W devices; on CPU simulated, at "
                       f"most {mesh_lib.MAX_CPU_DEVICES}, on GPU/TPU the host's devices, e.g. "
                       "1,1 on one GPU)")
  ap.add_argument('--fma_units', type=int_at_least(1), default=None,
                  help='fp32 FMA units per core for the CPU peak (None: from lscpu)')
  ap.add_argument('--clock_ghz', type=number_in(0, lo_open=True), default=None,
                  help='CPU clock for the CPU peak, GHz (None: from lscpu)')
  ap.add_argument('--peak_tflops', type=number_in(0, lo_open=True), default=None,
                  help='peak FLOP/s of the accelerator, for its MFU (None: on CPU from lscpu)')
  args = ap.parse_args()
  try:
    D, W = mesh_lib.parse_shape(args.mesh)  # pylint: disable=invalid-name
  except ValueError as e:
    ap.error(str(e))
  if D * W > mesh_lib.MAX_CPU_DEVICES:  # configure_cpu_devices' limit
    ap.error(f'argument --mesh: {args.mesh} asks for D x W = {D * W} devices; at most '
             f'{mesh_lib.MAX_CPU_DEVICES} simulated devices are allowed in one process')
  names = arg_types.model_names(ap, args.model, CHOICES, models.MODELS)
  mesh_lib.configure_cpu_devices(D * W)  # before anything starts the backend
  try:
    have = len(mesh_lib.global_devices())  # starts the backend; compiles nothing
  except mesh_lib.BackendUnavailableError as e:
    ap.error(str(e))
  if have != D * W:  # a GPU/TPU host: its own devices
    ap.error(f'argument --mesh: {args.mesh} asks for D x W = {D * W} devices; this process '
             f'has {have} {jax.default_backend()} device(s), so D x W must be {have}')
  backend = jax.default_backend()
  if args.peak_tflops is not None:
    peak, derivation = args.peak_tflops * 1e12, f'{args.peak_tflops} TFLOP/s (--peak_tflops)'
  elif backend == 'cpu':
    peak, derivation = this_cpu_peak_flops(args.fma_units, args.clock_ghz)
  else:
    peak, derivation = float('nan'), f'unknown for {backend} (give --peak_tflops): no MFU'
  print(f'peak: {derivation}')
  print(f'allocator: {runtime.active() or "glibc malloc"}; {D}x{W} mesh of '
        f'{jax.device_count()} {backend} devices ({jax.devices()[0].device_kind}); '
        f'{args.batch} examples per worker, global batch '
        f'{D * W * args.batch}; median of {args.blocks} alternating blocks of {args.steps} steps'
        + (f' (K={args.k}: {-(-args.steps // args.k) * args.k}, whole rounds)'
           if args.steps % args.k else ''))
  mesh = mesh_lib.make_mesh(D, W)
  print('\n| model | input | model GFLOP/step (jaxpr) | XLA GFLOP/step: hier. / DP / 1 dev. | '
        f'hierarchical steps/s | data-parallel steps/s | hier. / DP: median (quartiles) of blocks | '
        f'hier. K={args.k} / DP: median (quartiles) | two-level floor / DP | hier. / floor | '
        'one device (jit) steps/s | '
        'MFU hierarchical | MFU one device | XLA MB accessed/step/device: hier. / DP |')
  print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|', flush=True)
  for name in names:  # each row as soon as its model is measured
    net, x, y, desc = build(name, args.batch, np.random.default_rng(0), D, W)
    progs, mf, mb = programs(net, x, y, mesh, args.k)
    r, ratios = measure(progs, args.steps, args.blocks)
    quart = lambda v: '{1:.3f} ({0:.3f}–{2:.3f})'.format(*np.percentile(v, [25, 50, 75]))
    mfu = lambda rate: '–' if np.isnan(peak) else f'{mf * rate / peak:.1%}'
    xla = ' / '.join(f'{progs[k][1] / 1e9:.3f}' for k in
                     ('hierarchical', 'data parallel', 'one device'))
    h, dp, one = r['hierarchical'], r['data parallel'], r['one device']
    print(f'| {name} | {desc} | {mf / 1e9:.3f} | {xla} | {h:.2f} | {dp:.2f} | '
          f'{quart(ratios["hierarchical"])} | {quart(ratios[f"hierarchical K={args.k}"])} | '
          f'{quart(ratios["two-level floor"])} | {quart(ratios["hierarchical / floor"])} | '
          f'{one:.2f} | {mfu(h)} | {mfu(one)} | '
          f'{mb[0]:.1f} / {mb[1]:.1f} |', flush=True)

if __name__ == '__main__':
  main()
