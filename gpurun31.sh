#!/bin/bash
# this session's head against its start (9a87722, .base): resident, 700 tokens, the minimum ring; the kernel table
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
[ -s /tmp/m8b_q8.bin ] && HAVE=1 || HAVE=0
[ $HAVE = 1 ] || ( rm -rf /tmp/hf8b; python3 tools/make_random_llama.py --shape 8b --out /tmp/hf8b --dtype float16 > /tmp/gen.log 2>&1 ) & G=$!
P=""
( make -j8 all build/bin/ceilings CRITERION=.crit > /tmp/b_B.log 2>&1 || echo FAIL B >> /tmp/b_B.log ) & P="$P $!"
( make -C .base -j6 all > /tmp/b_A.log 2>&1 || echo FAIL A >> /tmp/b_A.log ) & P="$P $!"
wait $P; t builds; grep -h FAIL /tmp/b_*.log && { grep -h -B5 "rror" /tmp/b_*.log | head -40; exit 1; }
QUANT_ONLY=1 build/bin/ceilings > $OUT/table_head.txt 2>&1; grep "^q\|D2D" $OUT/table_head.txt
wait $G; tail -1 /tmp/gen.log; t gen
[ $HAVE = 1 ] || { ./convert/convert /tmp/hf8b /tmp/m8b_q4.bin --dtype q4 --tokenizer .shared/tokenizers/llama3 -q & C1=$!
./convert/convert /tmp/hf8b /tmp/m8b_q8.bin --dtype q8 --tokenizer .shared/tokenizers/llama3 -q; wait $C1; t converted; }
CASES="resident_decode decode_700 min_link min_share" bash bench/ab.sh $PWD/.base $PWD /tmp/m8b_q4.bin $OUT/ab_q4_session.json 3 2>&1 | grep "^| [rdm]\|ab:"
CASES="resident_decode" bash bench/ab.sh $PWD/.base $PWD /tmp/m8b_q8.bin $OUT/ab_q8_session.json 3 2>&1 | grep "^| [rdm]\|ab:"
t ab
