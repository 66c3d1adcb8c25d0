#!/usr/bin/env python3
"""Regenerates mmloader/data/tiny-tokenizer.json: a small byte-level BPE tokenizer of our
own with the Qwen2/2.5/3 configuration (NFC normalizer, the Qwen split regex, ByteLevel
pre-tokenizer / post-processor / decoder) and the Qwen special tokens.

It is trained with the Hugging Face `tokenizers` BPE trainer on a corpus this script builds
itself from a fixed seed, so the output is the same on every run:

    python3 tools/make_tiny_tokenizer.py            # writes the packaged file
    python3 tools/make_tiny_tokenizer.py --check    # exits 1 if the packaged file differs
"""
import argparse
import json
import os
import random
import sys

os.environ["RAYON_NUM_THREADS"] = "1"  # a single trainer thread: no ordering questions
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "mmloader", "data", "tiny-tokenizer.json")

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
NUM_MERGES = 3000
# Qwen's special tokens, in Qwen's order (ids follow the trained vocabulary).
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
NON_SPECIAL = ["<tool_call>", "</tool_call>"]  # added tokens that are not special, as in Qwen

# The exact pipeline objects of Qwen's tokenizer.json.
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
              "use_regex": False}
PIPELINE = {
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated",
         "invert": False},
        BYTE_LEVEL]},
    "post_processor": BYTE_LEVEL,
    "decoder": BYTE_LEVEL,
}

WORDS = """the of and to in a is that for it as was with be by on not he I this are or his
from at which but have an they you were her she there been one all we their has would when
what will if no out so said who up can more about into them some could him time these two may
then do first any my now such like other how its our over only new also me after us most did
made many before must through back years where much your way well down should because each
just those people how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might great old
year off come since against go came right used take three model data image token batch train
loader thread buffer tensor memory python rust kernel vision language assistant user system
question answer describe picture shows cat dog street car tree house sky water people table
please thanks sure here's let's don't won't it's I'm you're we've they'll she'd isn't""".split()
CJK = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过"
       "子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体"
       "制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数"
       "正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题"
       "党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手"
       "角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器"
       "压志世金增争济阶油思术极交受联什认六共权收证改清美再采转更单风切打白教速花带安场身车例真务具万"
       "每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林"
       "律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史"
       "感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层"
       "片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严龙飞")
OTHER_SCRIPTS = ["مرحبا بالعالم", "اللغة العربية جميلة", "नमस्ते दुनिया", "हिन्दी भाषा",
                 "Привет мир", "Съешь же ещё этих мягких французских булок", "Γειά σου Κόσμε",
                 "こんにちは世界", "カタカナとひらがな", "안녕하세요 세계", "สวัสดีชาวโลก",
                 "שלום עולם", "Xin chào thế giới", "Ça va? Très bien, merci.", "Größe Straße"]
CODE = ["def f(x):\n    return x + 1\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
        "import numpy as np\nx = np.zeros((3, 4))\n", "if (a && b) { return -1; }\r\n",
        "SELECT * FROM t WHERE id = 42;", "{\"key\": [1, 2, 3], \"ok\": true}",
        "<div class=\"row\"><img src=\"a.png\"/></div>", "x = y ** 2 // 3 % 7 != 0"]


def build_corpus(seed: int = 20240501) -> list:
    rnd = random.Random(seed)
    lines = []
    for _ in range(12000):
        kind = rnd.random()
        if kind < 0.55:
            n = rnd.randint(4, 24)
            words = [rnd.choice(WORDS) for _ in range(n)]
            if rnd.random() < 0.3:
                words[0] = words[0].capitalize()
            s = " ".join(words) + rnd.choice([".", "!", "?", ",", ":", ""])
        elif kind < 0.70:
            s = "".join(rnd.choice(CJK) for _ in range(rnd.randint(4, 30))) + rnd.choice("。，！？")
        elif kind < 0.80:
            s = rnd.choice(OTHER_SCRIPTS)
        elif kind < 0.90:
            s = rnd.choice(CODE)
        else:
            s = f"{rnd.randint(0, 10**6)} + {rnd.random():.4f} = {rnd.randint(-999, 999)} ({rnd.choice(WORDS)})"
        if rnd.random() < 0.2:
            s = f"<|im_start|>{rnd.choice(['user', 'assistant', 'system'])}\n{s}<|im_end|>\n"
        lines.append(s)
    return lines


def build() -> str:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + NUM_MERGES, min_frequency=2,
                                  initial_alphabet=alphabet, show_progress=False,
                                  special_tokens=[])
    tok.train_from_iterator(build_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    d = json.loads(tok.to_str())
    d.update(PIPELINE)
    text = json.dumps(d, ensure_ascii=False, indent=1) + "\n"
    Tokenizer.from_str(text)  # must load in the reference library
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the packaged file")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    text = build()
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print("up to date" if same else f"{args.out} differs from a fresh build")
        return 0 if same else 1
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
