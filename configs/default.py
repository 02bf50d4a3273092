"""Default experiment: 2 DCs x 4 workers, non-IID Fashion-MNIST, periodic sync every 4 steps.

Run:
  python main.py --config=configs/default.py --workdir=/tmp/hfl_default
Override any field from the command line, e.g. ``--config.sync.k=8``.
"""

import ml_collections

from hfl.sync import strategies


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the default config.

  Raises:
    ValueError: ``arg`` given (``--config=configs/default.py:ARG``): the shipped
      configs take none; override fields with ``--config.FIELD=VALUE``.
  """
  if arg:
    raise ValueError(f"this config takes no argument after ':' (got {arg!r}); override "
                     'fields with --config.FIELD=VALUE instead.')
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.mesh = ml_collections.ConfigDict()
  c.mesh.num_dcs = 2            # size of mesh axis 'dc'
  c.mesh.workers_per_dc = 4     # size of mesh axis 'worker'
  # auto | devices | vmap: one device per (DC, worker) under shard_map ('devices'), or the
  # whole hierarchy on one device under nested jax.vmap ('vmap'); 'auto' = vmap when the
  # backend has fewer devices than num_dcs * workers_per_dc (on CPU main.py simulates
  # that many, up to 256)
  c.mesh.simulate = 'auto'

  c.dataset = ml_collections.ConfigDict()
  # fashion_mnist | mnist (IDX files) | tiny_shakespeare | text (a text file, char LM) |
  # any other name, e.g. cifar10: an image folder (data_dir a .tar[.gz] or a directory of
  # train/<class>/<image>, test/<class>/<image>) or a prepared TFDS dataset
  c.dataset.name = 'fashion_mnist'
  c.dataset.data_dir = '/usr/share/datasets/fashion-mnist'  # IDX dir | text | image folder | TFDS
  c.dataset.cache_dir = ''           # image-folder cache ('' = $HFL_CACHE_DIR or ~/.cache/hfl)
  c.dataset.partition = 'dirichlet'  # images: iid | dirichlet; text: iid | contiguous
  c.dataset.dirichlet_alpha = 0.5    # label-skew concentration (smaller = more non-IID)
  c.dataset.augment = 'none'         # none | crop_flip (4-px padded random crop + flip; images)

  c.model = ml_collections.ConfigDict()
  c.model.name = 'cnn'               # cnn | mlp | cifar_cnn | resnet20 | transformer (text)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'momentum'      # sgd | momentum | nesterov | adam | adamw | muon
  c.optimizer.learning_rate = 0.05
  c.optimizer.momentum = 0.9
  c.optimizer.weight_decay = 0.0
  c.optimizer.schedule = 'constant'  # constant | cosine | linear (learning_rate is the peak)
  c.optimizer.warmup_steps = 0       # linear warm-up from 0 over this many optimizer steps
  c.optimizer.decay_steps = 0        # end of the decay, warm-up included (0 = train.num_steps)
  c.optimizer.final_lr_ratio = 0.0   # learning rate at the end of the decay / peak
  c.optimizer.freeze_second_moment_after = 0  # adam/adamw: v frozen after this step (0 = off)
  c.optimizer.muon_adam_learning_rate = 0.0  # muon: its AdamW's peak lr (0 = learning_rate)
  c.optimizer.muon_leaves = 'matrices'       # muon: matrices (2-D leaves) | kernels (weights)
  c.optimizer.muon_exclude = ''              # muon: regex on leaf paths kept on AdamW
  c.optimizer.shard_state = False    # ZeRO-1: each worker holds 1/W of its DC's optimizer state

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 800            # intra-DC iterations of the fastest DC (0 = unset)
  c.train.sim_time_budget_s = 0.0    # or: stop at this simulated time, s (0 = unset; hfl.budget)
  c.train.sample_budget = 0          # or: stop at this many samples of all DCs (0 = unset)
  c.train.batch_size = 32            # per worker
  c.train.eval_every = 25            # inter-DC rounds between evaluations
  c.train.checkpoint_every = 50      # inter-DC rounds between checkpoints (0: only at the end)
  c.train.target_accuracy = 0.88     # classification: time_to_target_s / rounds_to_target
  c.train.target_loss = 1.7          # language modelling: the same for the validation loss (nats)
  c.train.eval_batch_size = 2000
  c.train.log_every = 50             # steps between progress lines

  c.sync = ml_collections.ConfigDict()
  c.sync.strategy = 'periodic'       # sync | periodic | semi_sync | adacomm | partial (hfl.sync.strategies)
  c.sync.k = 4                       # intra-DC iterations per inter-DC round (K; K_base for semi_sync)
  c.sync.k_max = 64                  # upper bound for any K_d
  c.sync.aggregation = 'fedavg'      # fedavg | fednova | samples (by samples processed)
  c.sync.progress_aware = False      # raise K as the loss plateaus (hfl.sync.schedule)
  c.sync.progress_window = 3         # rounds over which the relative loss improvement is measured
  c.sync.progress_threshold = 0.01   # relative improvement below which K is multiplied
  c.sync.progress_factor = 2.0       # multiplier applied to K on a plateau
  c.sync.outer = ml_collections.ConfigDict()
  c.sync.outer.name = 'avg'          # avg (FedAvg, outer SGD lr 1) | nesterov (DiLoCo)
  c.sync.outer.learning_rate = 1.0
  c.sync.outer.momentum = 0.0
  # Streaming DiLoCo (hfl.sync.streaming; Douillard et al. 2025): off with these values.
  c.sync.fragments = 1               # P fragments by layer order; one syncs every k / P iterations
  c.sync.overlap_steps = 0           # τ: a fragment's exchange is merged τ iterations later
  c.sync.mixing_alpha = 0.0          # α: merge x <- α x_local + (1 - α) x_global (0 replaces)
  c.sync.eager = False               # apply the DC's own outer step until the global one arrives
  c.sync.faults = ''                 # DC outages, 'dc:round-round,...' e.g. '1:10-12' (from 1)
  # Remedies for heterogeneous DCs (issue 15; docs/semisync.md). All off by default.
  c.sync.k_min_ratio = 0.0           # semi_sync: every K_d >= ceil(ratio * max K_d) (0: off)
  c.sync.lr_scaling = 'none'         # none | inverse_k (DC lr x min K / K_d)
  c.sync.prox_mu = 0.0               # FedProx proximal coefficient mu (0: off)
  c.sync.progress_test = 'endpoints'  # plateau test: endpoints | window_means (hfl.sync.schedule)
  c.sync.k_max_scope = 'every_dc'    # semi_sync: k_max caps every_dc's K_d | k_base (slowest) only
  c.sync.control_variates = 'none'   # none | scaffold (SCAFFOLD, hfl.sync.scaffold; 2x the WAN)
  # Each sync strategy's own fields, with their defaults (hfl.sync.strategies, one module
  # per strategy: Strategy.hyper), e.g. sync.participation = 1.0 ('partial': the fraction
  # of the DCs that exchange each round, in turn).
  for field, value in strategies.hyper_defaults().items():
    c.sync[field] = value

  c.compression = ml_collections.ConfigDict()
  c.compression.uplink = _compressor('identity')    # worker -> PS (large tensors)
  c.compression.downlink = _compressor('identity')  # PS -> workers (large tensors)
  c.compression.wan = _compressor('identity')       # DC -> global (pseudo-gradient, all tensors)
  c.compression.small_threshold = 0  # leaves with fewer entries (or ndim < 2) use `small`
  c.compression.small = 'float32'    # float32 | bfloat16 | float16: precision of small leaves
  c.compression.dense_leaves = ''     # regex on leaf paths sent as small leaves ('' = none)
  # How a round's new global model reaches each DC's workers (hfl.step.broadcast_leaves):
  # 'downlink' (the thesis's design): the PS sends the correction through the downlink
  # compressor with its own error feedback wherever that is lossy (bitwise 'gather'
  # where it is lossless); 'gather': the global model itself (float32 for identity WAN).
  c.compression.broadcast = 'downlink'
  # The round's correction at its own density (top-k / random-k downlinks; 0: the
  # downlink's). It carries K iterations of the other DCs' progress in one payload per round.
  c.compression.broadcast_density = 0.0
  # The round's correction through its own compressor ('' name: the downlink's, at
  # broadcast_density if set), e.g. name='e3m0': a 4-bit low-bit float correction after
  # top-k iterations (the thesis's mixed precision on the one dense payload per round).
  c.compression.correction = _compressor('')
  # What the workers send up (hfl.step.SENDS): 'gradient' (the thesis's design: every
  # worker applies the optimizer to the PS's aggregate) or 'update' (each worker runs the
  # optimizer on its own gradient with its own state and sends the update; the PS averages
  # updates: compression after the optimizer, hfl.step.worker_update).
  c.compression.send = 'gradient'
  # Deep Gradient Compression options (Lin et al., ICLR 2018; hfl.compress.dgc).
  c.compression.dgc = ml_collections.ConfigDict()
  c.compression.dgc.momentum = 0.0       # momentum correction m (0: off); needs optimizer.name='sgd'
  c.compression.dgc.clip_norm = 0.0      # local gradient clipping threshold (0: off), x 1/sqrt(W)
  c.compression.dgc.warmup_steps = 0     # density warm-up length in steps (0: off; topk/randk links)
  c.compression.dgc.initial_density = 0.25  # warm-up density of stage 0
  c.compression.dgc.num_stages = 4       # warm-up stages (density falls exponentially per stage)

  c.network = ml_collections.ConfigDict()
  c.network.compute_time_s = 0.05    # one worker's compute time per iteration at speed 1 (s)
  c.network.dc_speed = (1.0, 1.0)    # relative compute speed per DC (time = compute_time_s / speed)
  c.network.lan_bandwidth_gbps = 10.0  # PS NIC bandwidth inside a DC (Gbit/s)
  c.network.lan_latency_s = 1e-4
  c.network.wan_bandwidth_mbps = 100.0  # per-DC WAN bandwidth (Mbit/s)
  c.network.wan_latency_s = 0.02
  c.network.wan_latencies_per_round = 2.0  # one-way WAN latencies per round (2: one exchange)
  return c


def _compressor(name: str, **kw) -> ml_collections.ConfigDict:
  """A compressor spec: name plus its hyper-parameters (see hfl.compress.policy)."""
  d = ml_collections.ConfigDict()
  d.name = name
  d.density = 0.01           # top-k / random-k fraction of entries kept
  d.levels = 16              # QSGD quantisation levels s
  d.bucket_size = 512        # QSGD entries per norm (bucket d of Alistarh et al.)
  d.rank = 2                 # PowerSGD rank r
  d.threshold_variant = False  # top-k: estimate the threshold instead of exact top_k
  d.fmt = 'fp4'              # CO3 float grid: fp4 = [1,2,1] (11 levels) | fp8 = [1,5,2]
  d.gamma = 0.9              # CO3 / chunked_topk error-feedback memory weight: p = g + gamma * e
  d.coder = 'huffman'        # CO3 lossless code: huffman (GenNorm-designed) | ans
  d.refit_every = 1          # CO3: re-fit the GenNorm shape every this many encodes
  d.chunk_size = 4096        # chunked_topk (SparseLoCo): entries per chunk, top-k in each
  d.value_bits = 2           # chunked_topk: 2 (sign + magnitude class) | 32 (float32 values)
  d.update(kw)
  return d
