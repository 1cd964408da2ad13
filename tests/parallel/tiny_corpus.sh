# Sourced by the multi-rank `dhelix train` test scripts: tiny_corpus SEED LINES OUT writes LINES
# lines of 12 random lowercase words (2-6 letters from a-l) to OUT, for `dhelix data prepare` to
# train a 256-piece BPE on.
tiny_corpus() {
  awk -v seed="$1" -v lines="$2" 'BEGIN { srand(seed); for (i = 0; i < lines; i++) { line = "";
    for (j = 0; j < 12; j++) { w = ""; n = 2 + int(rand() * 5);
      for (k = 0; k < n; k++) w = w sprintf("%c", 97 + int(rand() * 12));
      line = line (j ? " " : "") w }
    print line } }' > "$3"
}
