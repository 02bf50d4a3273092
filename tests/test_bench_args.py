"""bench/ scripts refuse bad arguments while parsing them (bench/arg_types.py)."""

import argparse
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'bench'))
import arg_types  # noqa: E402  pylint: disable=g-import-not-at-top


def test_converters_accept_good_values_and_name_the_rule():
  assert arg_types.int_at_least(1)('3') == 3
  assert arg_types.number_in(0, 1, lo_open=True)('1') == 1.0
  assert arg_types.int_list(1000, 1000)('1000,20000') == [1000, 20000]
  assert arg_types.number_list(0)('10, 2.5') == [10.0, 2.5]
  assert arg_types.names_in(('a', 'b'))('b,a') == ['b', 'a']
  assert arg_types.existing_path()(REPO) == REPO
  for conv, text, rule in ((arg_types.int_at_least(1), '0', '>= 1'),
                           (arg_types.int_at_least(1), 'x', 'not an integer'),
                           (arg_types.number_in(0, 1, lo_open=True), '0', 'in (0, 1]'),
                           (arg_types.number_in(0, lo_open=True), 'inf', '> 0'),
                           (arg_types.number_in(0), 'nan', 'finite'),
                           (arg_types.int_list(1000, 1000), '1000,1500', 'multiple of 1000'),
                           (arg_types.int_list(), 'abc', 'not an integer'),
                           (arg_types.number_list(0), '1,-2', '>= 0'),
                           (arg_types.names_in(('a', 'b'), 'variant'), 'a,c',
                            "unknown variant 'c' (allowed: a, b)"),
                           (arg_types.existing_path(), '/nonexistent', 'does not exist'),
                           (arg_types.existing_path(files_only=True), REPO, 'is not a file')):
    with pytest.raises(argparse.ArgumentTypeError) as e:
      conv(text)
    assert rule in str(e.value), (text, str(e.value))


@pytest.mark.parametrize('script, flags, needle', [
    ('compressed_step.py', ['--density=0'],
     'argument --density: 0 must be a finite number in (0, 1]'),
    ('zero_memory.py', ['--optimizer=bogus'], "argument --optimizer: invalid choice: 'bogus'"),
    ('compressors.py', ['--only=bogus'], "'bogus' matches no compressor"),
    ('co3.py', ['--fmt=bogus'], "argument --fmt: co3: fmt='bogus' is not a float format"),
    ('plateau_replay.py', ['/nonexistent'], 'no /nonexistent/metrics.jsonl'),
    ('allocator.py', ['--variants=glibc,jemalloc'], "unknown variant 'jemalloc'"),
    ('cifar_models.py', ['--models=cnn,vgg'], "unknown model 'vgg'"),
    ('wan_model_check.py', ['--ks=1,8'], 'argument --ks:'),
    ('max_pool.py', ['--shapes=256x28x28x32,2x3x4'], "'2x3x4' is not a shape BxHxWxC"),
    ('trace_step.py', ['--model=cnn,vgg'], "--model='vgg' is not one of"),
    ('step_throughput.py', ['--mesh=300,1'],
     'argument --mesh: 300,1 asks for D x W = 300 devices; at most 256'),
    ('step_throughput.py', ['--model=mlp,cnn,mlp'], "argument --model: 'mlp' is repeated"),
    ('step_throughput.py', ['--model=transformer_huge'],
     "--model='transformer_huge' is not one of cnn, mlp, cifar_cnn, resnet20, transformer, "
     'transformer_large'),
    ('op_count.py', ['--model=cnn,vgg'], "--model='vgg' is not one of"),
    ('op_count.py', ['--model=cnn,cnn'], "argument --model: 'cnn' is repeated"),
    ('op_count.py', ['--batch=0'], 'argument --batch: 0 must be an integer >= 1'),
    ('op_count.py', ['--mesh=300,1'], 'argument --mesh: 300,1 asks for D x W = 300 devices'),
])
def test_bad_arguments_end_before_any_compilation(script, flags, needle):
  """These used to end in tracebacks, some after dozens of compilations (or, for
  --only, to run the copy row alone with status 0)."""
  env = dict(os.environ, JAX_LOG_COMPILES='1', JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, os.path.join(REPO, 'bench', script)] + flags,
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  errors = [l for l in proc.stderr.splitlines() if 'error:' in l]
  assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr and 'Compiling' not in proc.stderr, proc.stderr[-2000:]


def test_step_throughput_help_shows_defaults():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  run = lambda *flags: subprocess.run(
      [sys.executable, os.path.join(REPO, 'bench', 'step_throughput.py'), *flags], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=120, check=False)
  options = re.split(r'\n  (?=-)', run('--help').stdout.split('options:')[1])[1:]
  shown = {o.split()[0]: re.search(r'\(default: ([^)]*)\)$', ' '.join(o.split()))
           for o in options}
  assert {k: m and m[1] for k, m in shown.items()} == {
      '-h,': None, '--model': 'cnn', '--steps': '30', '--blocks': '4', '--batch': '32',
      '--k': '4', '--mesh': '2,4', '--fma_units': 'None', '--clock_ghz': 'None',
      '--peak_tflops': 'None'}, shown


def test_same_results_help_exits_0_and_wrong_arguments_2():
  script = os.path.join(REPO, 'bench', 'same_results.py')
  run = lambda *a: subprocess.run([sys.executable, script, *a], capture_output=True, text=True,
                                  timeout=60, check=False)
  for flag in ('-h', '--help'):
    proc = run(flag)
    assert proc.returncode == 0 and 'same_results.py' in proc.stdout, proc
  assert run().returncode == 2
