# Make pentad importable on a GPU machine that has torch and transformers but not pentad's other
# dependencies, for bench/gpu_pretrain.py. Source it from the repository root:
#
#     . bench/gpu_setup.sh [WHEELS_DIR]        # WHEELS_DIR: default .whl
#
# It installs the carried wheels into /tmp/site (no index: the machine reaches no registry) and
# exports PYTHONPATH=/tmp/site:<repo>/src, so that `python3 bench/gpu_pretrain.py` and the
# `python3 -m pentad` subprocesses of its --cli mode import pentad from this tree.
#
# What to carry. Of pyproject.toml's dependencies, `pentad pretrain` and the benchmark import torch,
# tokenizers, sentencepiece, safetensors, numpy, pydantic, PyYAML, tqdm and matplotlib at run time
# (sacrebleu, rouge-score, soundfile, soxr, kaldi-native-fbank and jiwer only for text2text metrics and
# speech, which this benchmark does not touch). The GPU image holds all of them but pydantic, whose
# wheels (and their own requirements) are built once in the repository root, on this side:
#
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#         typing-extensions==4.16.0
#
# (about 3 MB; pydantic-core's version must be the one pydantic's METADATA pins:
# `unzip -p .whl/pydantic-2*.whl '*/METADATA' | grep ^Requires-Dist`; keep one version of each.)
# The --cli mode's corpus and vocabulary, and TencentPretrain's model code (its `tencentpretrain/`
# package and the config files the benchmark reads; none of it is committed here), travel the same way:
#
#     echo /.benchdata/ >> .git/info/exclude; echo /.tp/ >> .git/info/exclude
#     mkdir -p .benchdata .tp/models
#     cp DATA/corpora/CLUECorpusSmall_sampled.txt .benchdata/corpus.txt    # one document per line
#     cp DATA/models/google_zh_vocab.txt .benchdata/vocab.txt               # a WordPiece vocabulary
#     cp -r TP/tencentpretrain .tp/ && cp -r TP/models/bert TP/models/gpt2 TP/models/llama \
#         TP/models/special_tokens_map.json .tp/models/
#
# (DATA: TencentPretrain's data folder, TP: a TencentPretrain checkout; about 3 MB in all.) Then the
# device run names ".whl", ".benchdata" and ".tp" in `carry`; the exact command is in the docstring of
# bench/gpu_pretrain.py.

_pentad_wheels="${1:-.whl}"
if [ ! -d "$_pentad_wheels" ] || ! ls "$_pentad_wheels"/*.whl >/dev/null 2>&1; then
    echo "gpu_setup.sh: no wheels in $_pentad_wheels (see this script's header)" >&2
    return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$_pentad_wheels"/*.whl || { return 1 2>/dev/null || exit 1; }
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import pydantic, pentad.builder, transformers, torch; print('pentad ready: torch', torch.__version__, \
'transformers', transformers.__version__, 'pydantic', pydantic.VERSION, 'cuda', torch.cuda.is_available())" \
    || { return 1 2>/dev/null || exit 1; }
unset _pentad_wheels
