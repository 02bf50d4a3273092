"""DeMo on the character LM: data parallel, each worker's momentum sent as the top
coefficients of its chunked DCT, the rest kept as error feedback, signSGD on the mean.

DeMo (Peng, Quesnelle & Kingma, arXiv:2411.19870, Algorithm 1): every worker keeps a
momentum m <- β m + g, sends the top k coefficients of each 64 x 64 chunk of DCT(m),
removes what it sent from m, and every worker steps x <- (1 - lr λ) x - lr sign(mean
of the decoded fast components). In hfl terms (``docs/demo.md``):

- the uplink compressor is ``dct_topk`` (hfl/compress/dct.py; chunk edge
  ``chunk_size`` = DeMo's 64, ``density`` 32 / 4096 = DeMo's top-32 per chunk) and its
  ``gamma`` is the error-feedback memory weight β = DeMo's momentum decay (0.999):
  hfl's per-worker residual e, p = g + β e, e <- p - decode(payload), IS DeMo's m;
- the PS averages the decoded payloads and sends the mean back losslessly
  (``compression.downlink`` identity), and the workers' inner optimizer is
  ``optimizer.name='signum'`` with ``momentum=0`` (signSGD: the momentum already lives
  in the residual) and decoupled weight decay;
- one DC of 8 workers, so there is no WAN: data parallel, every iteration synchronous
  (the DeMo setting). The inter-DC round of one DC changes nothing (its global model is
  its own), so K only sets how often hfl runs it: K = 16 as configs/shakespeare.py, so
  ``train.eval_every`` counts the same iterations.

Everything else is configs/shakespeare.py (same model, data and global batch of 8 x 4
windows of 128 characters). 1-D leaves (biases, LayerNorm scales) are not compressed
(hfl's policy sends them dense in float32, identity: no residual, so signSGD of their
mean gradient without momentum); docs/demo.md lists this and the other differences.
The learning rate is a signSGD one (DeMo's reference runs use 1e-3 at 300M-1B
parameters); it was not tuned here.

  python main.py --config=configs/demo.py --workdir=workdirs/demo
"""

from configs import shakespeare


def get_config(arg: str | None = None):
  c = shakespeare.get_config(arg)
  c.mesh.num_dcs = 1
  c.mesh.workers_per_dc = 8
  c.network.dc_speed = (1.0,)
  c.optimizer.name = 'signum'
  c.optimizer.momentum = 0.0          # signSGD: DeMo's momentum is the uplink's EF residual
  c.optimizer.learning_rate = 1e-3
  c.optimizer.weight_decay = 0.1      # decoupled: x <- x - lr (sign(q) + 0.1 x)
  c.compression.uplink.name = 'dct_topk'
  c.compression.uplink.chunk_size = 64       # DeMo's compression_chunk: 64 x 64 chunks
  c.compression.uplink.density = 32 / 4096   # DeMo's compression_topk = 32 per chunk
  c.compression.uplink.gamma = 0.999         # DeMo's compression_decay β
  return c
