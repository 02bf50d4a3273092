"""Published numbers hfl measures itself against (DESIGN section 6), as data.

Every anchor is one quantitative claim of one publication, with the citation
and the place in DESIGN.md it comes from, so that ``hfl.report.results`` can
put the published number next to ours without prose scattered in code. Values
use the same conventions as the report tables:

* reductions and compression ratios are fractions in [0, 1]
  (0.66 = "66% fewer"), computed as 1 − ours / baseline;
* compression factors are multiples (270.0 = "270× fewer bytes");
* accuracy differences are in percentage points (0.0 = "no accuracy loss").

``comparator`` says how the claim bounds the quantity: ``'up_to'`` (the best
case reported), ``'at_least'``, ``'about'`` (approximately equal) or
``'range'`` (``value`` .. ``value_high``).

The seed thesis is cited as DESIGN.md section 6 describes it (its title is not
recorded there); the other citations are the publications themselves.
"""

from typing import NamedTuple

DESIGN_SECTION = 'DESIGN.md §6 (Anchors)'

# Tolerance in accuracy points under which we call a difference "no accuracy
# loss" / "≈ uncompressed" (issue 3: "loses ≤ 0.5 accuracy points").
NO_LOSS_TOLERANCE_POINTS = 0.5


class Citation(NamedTuple):
  """Where a claim was published.

  Attributes:
    short: short name used in tables, e.g. ``'DGC (ICLR 2018)'``.
    reference: full reference (authors, title, venue, year).
    url: a stable link (arXiv) or '' when none is recorded.
  """
  short: str
  reference: str
  url: str = ''


class Anchor(NamedTuple):
  """One published claim.

  Attributes:
    key: stable identifier, e.g. ``'thesis.semisync.rounds_reduction'``.
    citation: the publication.
    quantity: what is measured, in words, with the baseline.
    value: the number (see the module docstring for units); None for a
      qualitative claim.
    unit: ``'fraction'`` (reduction / ratio), ``'x'`` (factor) or
      ``'points'`` (accuracy points); '' for a qualitative claim.
    comparator: ``'up_to'``, ``'at_least'``, ``'about'`` or ``'range'``.
    claim: the claim as DESIGN.md section 6 states it.
    value_high: upper end of a ``'range'`` claim.
    source: where in this repository the claim is recorded.
  """
  key: str
  citation: Citation
  quantity: str
  value: float | None
  unit: str
  comparator: str
  claim: str
  value_high: float | None = None
  source: str = DESIGN_SECTION

  def text(self) -> str:
    """The published number as a table cell, e.g. ``'up to 66%'``."""
    if self.value is None:
      return self.claim
    if self.unit == 'points' and self.value == 0:
      return 'no loss (Δ ≈ 0 pts)'
    fmt = {
        'fraction': lambda v: f'{100 * v:.0f}%',
        'x': lambda v: f'{v:g}×',
        'points': lambda v: f'{v:+g} pts',
    }[self.unit]
    prefix = {'up_to': 'up to ', 'at_least': '≥ ', 'about': '≈ ',
              'range': ''}[self.comparator]
    if self.comparator == 'range':
      return f'{fmt(self.value).rstrip("×%")}–{fmt(self.value_high)}'
    return prefix + fmt(self.value)


THESIS = Citation(
    short='thesis (seed)',
    reference=('Seed thesis on communication-efficient hierarchical FL '
               'across datacenters (optimised HPS, semi-synchronous sync, '
               'bidirectional sparse + mixed-precision compression), as '
               'summarised in DESIGN.md §6'))
CO3 = Citation(
    short='CO3 (2022)',
    reference=('Z.-J. Chen, E. E. Hernandez, Y.-C. Huang, S. Rini. "Convert, '
               'compress, correct: Three steps toward communication-efficient '
               'DNN training", arXiv:2203.09044, 2022'),
    url='https://arxiv.org/abs/2203.09044')
DGC = Citation(
    short='DGC (ICLR 2018)',
    reference=('Y. Lin, S. Han, H. Mao, Y. Wang, W. J. Dally. "Deep Gradient '
               'Compression: Reducing the Communication Bandwidth for '
               'Distributed Training", ICLR 2018'),
    url='https://arxiv.org/abs/1712.01887')
DILOCO = Citation(
    short='DiLoCo (2023)',
    reference=('A. Douillard et al. "DiLoCo: Distributed Low-Communication '
               'Training of Language Models", 2023'),
    url='https://arxiv.org/abs/2311.08105')
STREAMING_DILOCO = Citation(
    short='Streaming DiLoCo (2025)',
    reference='Streaming DiLoCo (Douillard et al.), 2025, as in DESIGN.md §6')
GAIA = Citation(
    short='Gaia (NSDI 2017)',
    reference=('K. Hsieh et al. "Gaia: Geo-Distributed Machine Learning '
               'Approaching LAN Speeds", NSDI 2017'))
LANFL = Citation(short='LanFL', reference='LanFL, as in DESIGN.md §6')
ONE_BIT_ADAM = Citation(
    short='1-bit Adam / 0/1 Adam',
    reference='1-bit Adam (Tang et al., 2021) / 0/1 Adam (Lu et al.), as in '
    'DESIGN.md §6')
POWERSGD = Citation(
    short='PowerSGD (NeurIPS 2019)',
    reference=('T. Vogels, S. P. Karimireddy, M. Jaggi. "PowerSGD: Practical '
               'Low-Rank Gradient Compression for Distributed Optimization", '
               'NeurIPS 2019'),
    url='https://arxiv.org/abs/1905.13727')

_THESIS_SEMISYNC_CLAIM = ('HPS + semi-sync: up to 66% fewer inter-DC rounds, '
                          '43% less convergence time, no accuracy loss')
_THESIS_COMPRESSION_CLAIM = ('bidirectional sparse + mixed precision: 95% '
                             'compression, up to 92% less convergence time')
_CO3_CLAIM = ('fp4 [1,2,1] + GenNorm-designed Huffman + EF γ=0.9 ≈ '
              'uncompressed accuracy at a fraction of the bits')
_DGC_CLAIM = ('270–600× gradient compression, no accuracy loss (momentum '
              'correction, clipping, masking, warm-up)')

ANCHORS: tuple[Anchor, ...] = (
    # Thesis comparisons 1/2: optimised HPS + semi-synchronous sync.
    Anchor('thesis.semisync.rounds_reduction', THESIS,
           'inter-DC rounds to the target accuracy, vs synchronous HPS (K=1)',
           0.66, 'fraction', 'up_to', _THESIS_SEMISYNC_CLAIM),
    Anchor('thesis.semisync.time_reduction', THESIS,
           'convergence time (time to the target accuracy), vs synchronous '
           'HPS (K=1)', 0.43, 'fraction', 'up_to', _THESIS_SEMISYNC_CLAIM),
    Anchor('thesis.semisync.accuracy_delta', THESIS,
           'final accuracy vs synchronous HPS (K=1)', 0.0, 'points', 'about',
           _THESIS_SEMISYNC_CLAIM),
    # Thesis comparison 3: bidirectional sparse + mixed precision.
    Anchor('thesis.compression.ratio', THESIS,
           'intra-DC compression ratio (up + down bytes), vs uncompressed',
           0.95, 'fraction', 'about', _THESIS_COMPRESSION_CLAIM),
    Anchor('thesis.compression.time_reduction', THESIS,
           'convergence time (time to the target accuracy), vs uncompressed',
           0.92, 'fraction', 'up_to', _THESIS_COMPRESSION_CLAIM),
    # DGC.
    Anchor('dgc.compression_factor', DGC,
           'gradient compression factor with no accuracy loss', 270.0, 'x',
           'range', _DGC_CLAIM, value_high=600.0),
    Anchor('dgc.accuracy_delta', DGC, 'accuracy vs uncompressed', 0.0,
           'points', 'about', _DGC_CLAIM),
    # CO3.
    Anchor('co3.accuracy_delta', CO3,
           'accuracy of fp4 + GenNorm Huffman + EF γ=0.9 vs uncompressed',
           0.0, 'points', 'about', _CO3_CLAIM),
    # Context (not measured by the results page yet).
    Anchor('diloco.communication_factor', DILOCO,
           'communication vs DDP at equal quality (inner AdamW, outer '
           'Nesterov, H=500)', 500.0, 'x', 'about',
           '500× less communication than DDP at equal quality'),
    Anchor('streaming_diloco.peak_bandwidth_factor', STREAMING_DILOCO,
           'peak bandwidth (fragment-wise sync + 4-bit outer gradients)',
           100.0, 'x', 'about', '~100× less peak bandwidth'),
    Anchor('gaia.speedup', GAIA, 'speed-up over naive geo-distributed '
           'training', 1.8, 'x', 'range',
           '1.8–53.5× over naive geo-distributed training, within '
           '0.94–1.40× of LAN speed', value_high=53.5),
    Anchor('lanfl.speedup', LANFL, 'speed-up', 1.5, 'x', 'range',
           '1.5–6× faster, 18–76× less WAN traffic', value_high=6.0),
    Anchor('lanfl.wan_traffic_factor', LANFL, 'WAN traffic reduction', 18.0,
           'x', 'range', '1.5–6× faster, 18–76× less WAN traffic',
           value_high=76.0),
    Anchor('one_bit_adam.communication', ONE_BIT_ADAM,
           'communication reduction (1-bit Adam: factor; 0/1 Adam: 87%)', 5.0,
           'x', 'up_to', 'up to 5× / 87% less communication'),
    Anchor('powersgd', POWERSGD, 'rank-r compression with EF', None, '',
           'about', 'rank-r compression with EF; consistent wall-clock gains'),
)

_BY_KEY = {a.key: a for a in ANCHORS}


def get(key: str) -> Anchor:
  """The anchor with this key.

  Raises:
    KeyError: for an unknown key (the message lists the known ones).
  """
  try:
    return _BY_KEY[key]
  except KeyError:
    raise KeyError(
        f'unknown anchor {key!r}; known: {sorted(_BY_KEY)}') from None
