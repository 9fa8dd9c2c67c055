#!/usr/bin/env python3
"""Builds the tiny-chat training corpus from extracted Debian packages.

Called by tools/make_talker_corpus.sh, which downloads the packages and
extracts each into ROOT/<package>/. Writes corpus-train.txt.xz,
corpus-val.txt.xz and SOURCES.md to --out. Documents are separated by the
line "<|endoftext|>"; about half of the text is synthesized ChatML
dialogues (definitions, facts, quotes, how-to answers, story continuation,
greetings), the rest plain English prose. Everything is deterministic:
a fixed seed, sorted inputs, and a hash of each item's key picks the
validation split (so all dialogues made from one word or page fall on the
same side).
"""

import argparse
import gzip
import html.parser
import lzma
import os
import random
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib

EOT = "<|endoftext|>"
SEED = 34

# Checked by hand against each package's /usr/share/doc/<pkg>/copyright.
LICENCES = {
    "r-cran-janeaustenr": "MIT (the R package); the six novels are in the "
                          "public domain",
    "r-cran-tokenizers": "MIT (the R package); Moby Dick is in the public "
                         "domain",
    "gnome-user-docs": "CC-BY-SA-3.0",
    "debian-handbook": "GPL-2+ or CC-BY-SA-3.0",
    "debian-faq": "GPL-2+",
    "jargon-text": "public domain",
    "dict-devil": "public domain",
    "fortunes": "BSD-3-clause (fortune-mod)",
    "fortunes-min": "BSD-3-clause (fortune-mod)",
    "wordnet-base": "WordNet 3.0 licence (BSD-like, permissive)",
    "bsdgames": "BSD-3-clause (quiz data files)",
    "python3.11-doc": "PSF-2.0 (Python Software Foundation License)",
}
USED_FOR = {
    "r-cran-janeaustenr": "prose (novels by chapter); story continuation "
                          "dialogues",
    "r-cran-tokenizers": "prose (Moby Dick by chapter); story continuation "
                         "dialogues",
    "gnome-user-docs": "prose (GNOME Help, English pages); how-to dialogues",
    "debian-handbook": "prose (The Debian Administrator's Handbook, en-US)",
    "debian-faq": "prose; question/answer dialogues",
    "jargon-text": "prose (Jargon File entries); slang dialogues",
    "dict-devil": "prose (The Devil's Dictionary); a few dialogues",
    "fortunes": "prose; quote and joke dialogues",
    "fortunes-min": "prose; quote and riddle dialogues",
    "wordnet-base": "definition, synonym, antonym, example dialogues",
    "bsdgames": "fact dialogues (capitals, elements, animal names)",
    "python3.11-doc": "prose (tutorial, FAQ, HOWTOs, reference; code "
                      "dropped); FAQ and glossary dialogues",
}

# Crude filter: fortunes and jargon entries that should not be repeated
# back to a user of a demo model.
BAD_WORDS = re.compile(
    r"\b(fuck\w*|shit\w*|cunt|nigg\w*|fag\w*|rape\w*|whore\w*|slut\w*|"
    r"bitch\w*|asshole\w*|dick|cock\w*|penis\w*|vagina\w*|sex\w*|porn\w*|"
    r"orgasm\w*|nazi\w*|hitler|kill\w*|suicide|jew\w*|negro\w*|retard\w*|"
    r"homosexual\w*|gay|lesbian\w*|naked|nude|drunk\w*|beer|marijuana|"
    r"cocaine|heroin|bastard\w*|damn\w*|hell|god|jesus|christ\w*|muslim\w*|"
    r"islam\w*|breast\w*|virgin\w*|prostitut\w*|murder\w*|gun\w*)\b",
    re.I)


def stable_hash(key):
    return zlib.crc32(key.encode("utf-8"))


def tidy(text):
    """Normalizes whitespace inside paragraphs and keeps paragraph breaks."""
    paras = re.split(r"\n\s*\n", text.replace("\r", ""))
    out = [re.sub(r"[ \t\n]+", " ", p).strip() for p in paras]
    return "\n\n".join(p for p in out if p)


def ascii_quotes(text):
    return (text.replace("\u201c", '"').replace("\u201d", '"')
            .replace("\u2018", "'").replace("\u2019", "'")
            .replace("\u2014", " - ").replace("\u2013", "-")
            .replace("\u00a0", " ").replace("\u2026", "..."))


def sentences(text):
    parts = re.split(r'(?:(?<=[.!?])|(?<=[.!?]["\')]))\s+(?=["\'(]?[A-Z])',
                     text)
    out = []
    for p in parts:
        # "Mr. Darcy" is one sentence
        if out and re.search(r"\b(Mr|Mrs|Dr|St|Messrs|Col|Capt)\.$", out[-1]):
            out[-1] += " " + p
        elif p:
            out.append(p)
    return out


# ---------------------------------------------------------------- R data

class RVec(list):
    attrs = None


def r_unserialize(buf):
    """Reads R's XDR serialization (enough for character vectors/lists)."""
    pos = [0]

    def i32():
        v = struct.unpack(">i", buf[pos[0]:pos[0] + 4])[0]
        pos[0] += 4
        return v

    if buf[:2] != b"X\n":
        raise ValueError("not an XDR R serialization")
    pos[0] = 2
    version = i32()
    i32()
    i32()
    if version == 3:
        n = i32()  # then the native encoding's name
        pos[0] += n
    refs = []

    def pairlist(flags):
        out = []
        while True:
            if flags & (1 << 9):
                item()
            tag = item() if flags & (1 << 10) else None
            out.append((tag, item()))
            flags = i32()
            if flags & 0xFF not in (2, 6, 17):
                pos[0] -= 4
                item()  # the terminating NILVALUE
                return out

    def item():
        flags = i32()
        t = flags & 0xFF
        if t == 254:
            return None
        if t == 255:
            r = flags >> 8
            return refs[(r or i32()) - 1]
        if t == 1:
            s = item()
            refs.append(s)
            return s
        if t == 9:
            n = i32()
            if n < 0:
                return None
            s = buf[pos[0]:pos[0] + n].decode("utf-8", "replace")
            pos[0] += n
            return s
        if t in (2, 6, 17):
            return pairlist(flags)
        n = i32()
        if t in (16, 19, 20):
            v = RVec(item() for _ in range(n))
        elif t in (10, 13):
            v = RVec(struct.unpack(">%di" % n, buf[pos[0]:pos[0] + 4 * n]))
            pos[0] += 4 * n
        elif t == 14:
            v = RVec(struct.unpack(">%dd" % n, buf[pos[0]:pos[0] + 8 * n]))
            pos[0] += 8 * n
        else:
            raise ValueError("unsupported R type %d" % t)
        if flags & (1 << 9):
            v.attrs = dict(item())
        return v

    return item()


def r_lazyload(datadir):
    """Returns {name: object} from an R package's data/Rdata.{rdx,rdb}."""
    with open(os.path.join(datadir, "Rdata.rdx"), "rb") as f:
        index = r_unserialize(gzip.decompress(f.read()))
    variables = dict(zip(index.attrs["names"], index))["variables"]
    names = variables.attrs["names"]
    with open(os.path.join(datadir, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    out = {}
    for name, (off, length) in zip(names, variables):
        blob = rdb[off:off + length]
        out[name] = r_unserialize(zlib.decompress(blob[4:]))
    return out


# ---------------------------------------------------------------- prose

def book_chapters(lines, title):
    """Splits a novel given as lines into (heading, paragraphs) chapters."""
    chapters, cur, head = [], [], None
    para = []
    for line in list(lines) + [""]:
        line = (line or "").strip()
        if re.match(r"^(CHAPTER|Chapter|VOLUME|Volume)\b", line) and \
                len(line) < 60:
            if para:
                cur.append(" ".join(para))
                para = []
            if cur and head:
                chapters.append((head, cur))
            cur, head = [], "%s, %s" % (title, line.title().rstrip("."))
            continue
        if not line:
            if para:
                cur.append(" ".join(para))
                para = []
            continue
        para.append(line)
    if cur and head:
        chapters.append((head, cur))
    out = []
    for head, paras in chapters:
        paras = [ascii_quotes(re.sub(r"_([^_]+)_", r"\1", p)) for p in paras]
        if sum(len(p) for p in paras) > 2000:
            out.append((head, paras))
    return out


def austen(root):
    data = r_lazyload(os.path.join(
        root, "r-cran-janeaustenr/usr/lib/R/site-library/janeaustenr/data"))
    titles = {
        "emma": "Emma", "mansfieldpark": "Mansfield Park",
        "northangerabbey": "Northanger Abbey", "persuasion": "Persuasion",
        "prideprejudice": "Pride and Prejudice",
        "sensesensibility": "Sense and Sensibility"}
    out = []
    for name in sorted(titles):
        out += book_chapters(data[name], titles[name])
    return out


def moby_dick(root):
    data = r_lazyload(os.path.join(
        root, "r-cran-tokenizers/usr/lib/R/site-library/tokenizers/data"))
    text = data["mobydick"][0]
    lines = text.replace("\r", "").split("\n")
    chapters = book_chapters(lines, "Moby Dick")
    return [c for c in chapters if not c[0].endswith("Etymology")]


class HtmlText(html.parser.HTMLParser):
    """HTML to paragraphs; drops scripts, styles, preformatted blocks and
    navigation."""
    BLOCK = {"p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "br",
             "tr", "dt", "dd", "table", "blockquote", "title", "section"}
    SKIP = {"script", "style", "pre", "head", "nav", "table"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.skip = [""], 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag in self.SKIP or (tag == "div" and re.search(
                r"navheader|navfooter|toc|footnote|legalnotice|screen",
                cls)):
            self.skip += 1
            self.stack_skip = getattr(self, "stack_skip", []) + [tag]
        elif tag in self.BLOCK:
            self.out.append("")

    def handle_endtag(self, tag):
        st = getattr(self, "stack_skip", [])
        if self.skip and st and st[-1] == tag:
            st.pop()
            self.skip -= 1
        elif tag in self.BLOCK:
            self.out.append("")

    def handle_data(self, data):
        if not self.skip:
            self.out[-1] += data


def html_paragraphs(path):
    p = HtmlText()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    paras = [re.sub(r"\s+", " ", ascii_quotes(x)).strip() for x in p.out]
    return [x for x in paras if x]


def prose_like(p, minlen=60, paths=False):
    """Keeps paragraphs that read as sentences, not commands or tables;
    paths=True lets file names and the odd symbol through (manuals)."""
    if len(p) < minlen or not re.search(r"[.!?:]\"?$", p):
        return False
    letters = sum(c.isalpha() or c == " " for c in p)
    if letters < (0.8 if paths else 0.85) * len(p):
        return False
    if paths:
        return not re.search(r"[{}<>$#|\\]", p)
    return not re.search(r"[{}<>$#|\\]|\w/\w+/|--\w|\(\)", p)


def handbook(root):
    base = os.path.join(root, "debian-handbook/usr/share/doc/"
                        "debian-handbook/html/en-US")
    out = []
    for name in sorted(os.listdir(base)):
        if not name.endswith(".html"):
            continue
        paras = [p for p in html_paragraphs(os.path.join(base, name))
                 if prose_like(p, 80, paths=True)]
        if sum(len(p) for p in paras) > 800:
            out.append(("handbook/" + name, paras))
    return out


def debian_faq(root):
    """Returns (prose docs, [(question, answer)])."""
    base = os.path.join(root, "debian-faq/usr/share/doc/debian/FAQ")
    docs, qa = [], []
    for name in sorted(os.listdir(base)):
        if not name.endswith(".en.html"):
            continue
        paras = html_paragraphs(os.path.join(base, name))
        keep = [p for p in paras if prose_like(p, 40) or p.endswith("?")]
        docs.append(("faq/" + name, [p for p in keep if prose_like(p)]))
        for i, p in enumerate(keep):
            m = re.match(r"^[\d.]+\s+(.*\?)$", p)
            if m and i + 1 < len(keep) and prose_like(keep[i + 1]):
                ans = [keep[i + 1]]
                if i + 2 < len(keep) and prose_like(keep[i + 2]) and \
                        len(ans[0]) < 400:
                    ans.append(keep[i + 2])
                qa.append((m.group(1), "\n\n".join(ans)))
    return docs, qa


def rst_inline(text):
    """Drops reStructuredText markup from running text."""
    text = re.sub(r":[a-z:]+:`!?~?([^`<]*?)\s*(<[^>]*>)?`", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*<[^>]*>`_+", r"\1", text)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`]*)`_*", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*",
                  lambda m: m.group(1) or m.group(2), text)
    text = text.replace("::", ":").replace("\\ ", "")
    return re.sub(r"\s+", " ", text).strip()


def rst_blocks(text):
    """Yields ("head", text) for section titles and ("p", text) for
    paragraphs at the left margin; code, directives and tables are
    dropped."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i])
            i += 1
        if block[0].startswith((" ", "\t", "..", "+", "=", ">>>", "|")):
            if len(block) >= 2 and re.match(r"^[=*]{3,}$", block[0]):
                block = block[1:]
            else:
                continue
        underline = r"^([=\-~^*#\"+])\1{2,}$"
        if len(block) >= 2 and re.match(underline, block[1].strip()):
            yield "head", rst_inline(block[0])
            block = block[2:]
            if not block:
                continue
        if any(ln.startswith(("   ", "\t", "..")) for ln in block):
            continue
        yield "p", rst_inline(" ".join(block))


def python_docs(root):
    """Returns (prose docs, FAQ [(question, answer)], glossary
    [(term, definition)]) from the Python 3.11 documentation sources."""
    base = os.path.join(root, "python3.11-doc/usr/share/doc/python3.11/"
                        "html/_sources")
    docs, qa, gloss = [], [], []
    for sub in ("tutorial", "faq", "howto", "reference", "using", "library",
                "installing"):
        for name in sorted(os.listdir(os.path.join(base, sub))):
            if not name.endswith(".rst.txt"):
                continue
            with open(os.path.join(base, sub, name), encoding="utf-8") as f:
                blocks = list(rst_blocks(f.read()))
            paras = []
            for k, (kind, t) in enumerate(blocks):
                t = ascii_quotes(t)
                if kind == "head":
                    if sub == "faq" and t.endswith("?") and \
                            k + 1 < len(blocks) and blocks[k + 1][0] == "p":
                        ans = [ascii_quotes(b[1]) for b in
                               blocks[k + 1:k + 3] if b[0] == "p"]
                        if ans and prose_like(ans[0], 40, paths=True):
                            if len(ans) > 1 and (len(ans[0]) > 400 or
                                                 not prose_like(ans[1], 40,
                                                                True)):
                                ans = ans[:1]
                            qa.append((t, "\n\n".join(ans)))
                    continue
                if prose_like(t, 60, paths=True):
                    paras.append(t)
            if sum(len(p) for p in paras) > 600:
                docs.append(("python/%s/%s" % (sub, name), paras))
    with open(os.path.join(base, "glossary.rst.txt"), encoding="utf-8") as f:
        text = f.read()
    for m in re.finditer(r"^   (\S[^\n]*)\n((?:      [^\n]*\n|\n)+)", text,
                         re.M):
        term = rst_inline(m.group(1))
        body = m.group(2).strip().split("\n\n")[0]
        body = ascii_quotes(rst_inline(body))
        if re.match(r"^[a-z][a-z -]+$", term) and prose_like(body, 40, True):
            gloss.append((term, body))
    return docs, qa, gloss


# Mallard (GNOME Help) pages
MAL = "{http://projectmallard.org/1.0/}"


def mal_text(el):
    """Inline text of a Mallard element: key sequences as Ctrl+C."""
    tag = el.tag.replace(MAL, "")
    if tag == "keyseq":
        return "+".join(mal_text(k) for k in el if isinstance(k.tag, str))
    if tag in ("media", "comment"):
        return el.tail or ""
    s = el.text or ""
    for c in el:
        if isinstance(c.tag, str):
            s += mal_text(c)
        s += c.tail or ""
    return s


def mal_blocks(el, out, depth=0):
    for c in el:
        if not isinstance(c.tag, str):
            continue
        tag = c.tag.replace(MAL, "")
        if tag in ("info", "links", "media", "code", "screen", "comment",
                   "synopsis"):
            continue
        if tag == "title" and depth > 0:
            out.append(("title", mal_text(c)))
        elif tag == "p":
            out.append(("p", mal_text(c)))
        elif tag == "steps":
            for n, item in enumerate(
                    [i for i in c if i.tag == MAL + "item"], 1):
                sub = []
                mal_blocks(item, sub, depth + 1)
                text = " ".join(t for k, t in sub if k == "p")
                out.append(("p", "%d. %s" % (n, text)))
        elif tag == "list":
            for item in c:
                if item.tag == MAL + "item":
                    sub = []
                    mal_blocks(item, sub, depth + 1)
                    text = " ".join(t for k, t in sub if k == "p")
                    out.append(("p", "- " + text))
        elif tag in ("section", "note", "terms", "item", "tree", "div",
                     "example"):
            mal_blocks(c, out, depth + 1)


def gnome_help(root):
    """Returns [(title, desc, paragraphs)] for each English GNOME Help
    topic page."""
    base = os.path.join(root, "gnome-user-docs/usr/share/help/C/gnome-help")
    out = []
    for name in sorted(os.listdir(base)):
        if not name.endswith(".page"):
            continue
        try:
            page = ET.parse(os.path.join(base, name)).getroot()
        except ET.ParseError:
            continue
        if page.get("type") == "guide":
            continue
        title = page.find(MAL + "title")
        desc = page.find(MAL + "info/" + MAL + "desc")
        if title is None:
            continue
        blocks = []
        mal_blocks(page, blocks, 0)
        paras = []
        for kind, t in blocks:
            t = re.sub(r"\s+", " ", ascii_quotes(t)).strip()
            if t and not t.startswith("- ") or len(t) > 8:
                paras.append(t + (":" if kind == "title" and t[-1:] not in
                                  ".?!:" else ""))
        text_len = sum(len(p) for p in paras)
        if text_len < 200:
            continue
        out.append((re.sub(r"\s+", " ", mal_text(title)).strip(),
                    re.sub(r"\s+", " ", mal_text(desc)).strip()
                    if desc is not None else "", paras))
    return out


def jargon(root):
    """Returns [(term, body paragraphs)] from the Jargon File lexicon."""
    path = os.path.join(root, "jargon-text/usr/share/doc/jargon-text/"
                        "jargon.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in re.finditer(r"^   :([^:\n]+):[^\n]*\n(.*?)(?=^   :[^:\n]+:|\Z)",
                         text, re.M | re.S):
        term, body = m.group(1).strip(), m.group(2)
        if re.search(r"[\u2500-\u257f]", body):
            continue
        body = re.sub(r"\{([^}]*)\}", r"\1", body)
        paras = [ascii_quotes(p) for p in tidy(body).split("\n\n")]
        paras = [p for p in paras if not re.match(r"^\[?Jargon|^Node:", p)]
        if paras and sum(len(p) for p in paras) > 80 and \
                not BAD_WORDS.search(term + " ".join(paras)):
            out.append((term, paras))
    return out


def devil(root):
    path = os.path.join(root, "dict-devil/usr/share/dictd/devil.dict.dz")
    with gzip.open(path, "rt", encoding="latin-1") as f:
        text = f.read()
    out = []
    for m in re.finditer(
            r"^([A-Z][A-Z'\- ]+), ([a-z.]+)\s+(.*?)(?=\n\n[A-Z][A-Z'\- ]+, "
            r"[a-z.]+\s|\Z)", text, re.M | re.S):
        word, body = m.group(1).strip(), m.group(3)
        body = re.sub(r"\[[^\]]*\]|\{|\}", "", body)
        first = tidy(body).split("\n\n")[0]
        if 20 < len(first) < 600 and not BAD_WORDS.search(first):
            out.append((word.lower(), first, tidy(body)))
    return out


FORTUNE_FILES = [
    "art", "computers", "cookie", "definitions", "education", "food",
    "fortunes", "goedel", "humorists", "kids", "law", "literature", "love",
    "magic", "medicine", "miscellaneous", "news", "people", "pets",
    "platitudes", "riddles", "science", "songs-poems", "sports", "tao",
    "wisdom", "work"]


def fortunes(root):
    """Returns [(file, text)], one per fortune."""
    out = []
    for name in FORTUNE_FILES:
        for pkg in ("fortunes", "fortunes-min"):
            path = os.path.join(root, pkg, "usr/share/games/fortunes", name)
            if os.path.exists(path) and not os.path.islink(path):
                break
        else:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            items = f.read().split("\n%\n")
        for it in items:
            it = it.strip("\n%").rstrip()
            it = re.sub(r"\t+", "    ", it)
            if 20 < len(it) < 700 and not BAD_WORDS.search(it) and \
                    sum(c.isalpha() for c in it) > 0.6 * len(it):
                out.append((name, ascii_quotes(it)))
    return out


# ---------------------------------------------------------------- WordNet

POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective",
            "r": "adverb"}


def wordnet(root):
    """Returns (synsets, lemmas): synsets[(pos, off)] = dict(words, defs,
    examples, hyper, anto); lemmas = [(lemma, pos, [offsets by frequency],
    tagged count)]."""
    base = os.path.join(root, "wordnet-base/usr/share/wordnet")
    synsets = {}
    for fpos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(base, "data." + fpos), encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                f_ = head.split()
                off, ss_type = f_[0], f_[2]
                n = int(f_[3], 16)
                words = [re.sub(r"\(.*\)$", "", f_[4 + 2 * i])
                         .replace("_", " ") for i in range(n)]
                i = 4 + 2 * n
                pcnt = int(f_[i])
                ptrs = [f_[i + 1 + 4 * k:i + 5 + 4 * k] for k in range(pcnt)]
                defs, examples = [], []
                for part in gloss.strip().split(";"):
                    part = part.strip()
                    if part.startswith('"'):
                        ex = part.strip('"').strip()
                        if ex:
                            examples.append(ex)
                    elif part and not examples:
                        defs.append(part)
                p = "a" if ss_type == "s" else ss_type
                synsets[(p, off)] = {
                    "pos": ss_type, "words": words, "defs": defs,
                    "examples": examples,
                    "hyper": [(q[2] if q[2] != "s" else "a", q[1])
                              for q in ptrs if q[0] in ("@", "@i")],
                    "anto": [(q[2] if q[2] != "s" else "a", q[1], q[3])
                             for q in ptrs if q[0] == "!"],
                }
    lemmas = []
    for fpos in ("noun", "verb", "adj", "adv"):
        with open(os.path.join(base, "index." + fpos),
                  encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                f_ = line.split()
                lemma, pos = f_[0].replace("_", " "), f_[1]
                cnt, pcnt = int(f_[2]), int(f_[3])
                tagged = int(f_[5 + pcnt])
                offs = f_[6 + pcnt:6 + pcnt + cnt]
                lemmas.append((lemma, pos, offs, tagged))
    return synsets, lemmas


# ---------------------------------------------------------------- quiz

def quiz_expand(s):
    """bsdgames quiz syntax: {optional}, [a|b], a|b; returns the first,
    fullest alternative."""
    def parse(i, stop):
        alts, cur = [], ""
        while i < len(s) and s[i] not in stop:
            c = s[i]
            if c == "{":
                sub, i = parse(i + 1, "}")
                cur += sub
            elif c == "[":
                sub, i = parse(i + 1, "]")
                cur += sub
            elif c == "|":
                alts.append(cur)
                cur = ""
            else:
                cur += c
            i += 1
        alts.append(cur)
        return alts[0], i
    return parse(0, "")[0].strip()


def quiz(root, name):
    path = os.path.join(root, "bsdgames/usr/share/games/bsdgames/quiz", name)
    with open(path, encoding="latin-1") as f:
        text = f.read().replace("\\\n", "")
    rows = []
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            rows.append([quiz_expand(x) for x in line.split(":")])
    return rows


# ---------------------------------------------------------------- dialogues

SYSTEMS = [
    "You are a helpful assistant.",
    "You are tiny-chat, a small assistant served by lmhost.",
    "You are a friendly assistant. Answer briefly.",
    "You are a helpful assistant that answers in plain English.",
]


def chat(rng, turns, system_p=0.2):
    """turns: [(user, assistant)] -> ChatML text."""
    s = ""
    if rng.random() < system_p:
        s += "<|im_start|>system\n%s<|im_end|>\n" % rng.choice(SYSTEMS)
    for u, a in turns:
        s += "<|im_start|>user\n%s<|im_end|>\n" % u.strip()
        s += "<|im_start|>assistant\n%s<|im_end|>\n" % a.strip()
    return s


def article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


def cap(s):
    return s[:1].upper() + s[1:]


def end_dot(s):
    s = s.strip()
    return s if s[-1:] in ".!?" else s + "."


def user_variants(rng, q):
    """Small surface noise on user turns: case, punctuation, politeness."""
    r = rng.random()
    if r < 0.12:
        q = q[:1].lower() + q[1:]
    elif r < 0.2:
        q = q.rstrip("?.!")
    elif r < 0.28:
        q = "Please, " + q[:1].lower() + q[1:]
    elif r < 0.33:
        q = q + " Thanks!"
    return q


def word_dialogues(rng, synsets, lemmas):
    """Yields (key, [(user, assistant)]) about WordNet lemmas: every word
    seen in WordNet's sense-tagged texts, a small sample of the rest."""
    by_lemma = {}
    for lemma, pos, offs, tagged in lemmas:
        by_lemma.setdefault(lemma, []).append((pos, offs, tagged))
    for lemma in sorted(by_lemma):
        entries = by_lemma[lemma]
        tagged = sum(e[2] for e in entries)
        if tagged == 0 and rng.random() > 0.12:
            continue
        if re.search(r"[^a-z' -]", lemma) or len(lemma) < 2:
            continue
        entries.sort(key=lambda e: -e[2])
        senses = []
        for pos, offs, _ in entries:
            for off in offs[:2 if tagged > 3 else 1]:
                ss = synsets[(pos, off)]
                if ss["defs"]:
                    senses.append((pos, ss))
        if not senses:
            continue
        # the spelling WordNet gives the first sense ("Paris", "TV")
        word = next((w for w in senses[0][1]["words"] if w.lower() == lemma),
                    lemma)
        plural = lemma.endswith("s") and lemma[:-1] in by_lemma
        n = 3 if tagged > 10 else 2 if tagged > 0 else 1
        for form in rng.sample(range(6), n):
            t = make_word_turn(rng, word, senses, synsets, form, plural)
            if t:
                yield "wn/" + lemma, [t]


def sense_sentence(word, pos, ss):
    d = ss["defs"][0]
    if word[:1].isupper():
        return "%s is %s." % (word, d)
    name = {"n": "a noun", "v": "a verb", "a": "an adjective",
            "s": "an adjective", "r": "an adverb"}[pos]
    return 'As %s, "%s" means %s.' % (name, word, d)


def example_with(lemma, ss, min_words=1):
    for ex in ss["examples"]:
        if lemma.split()[0][:4].lower() in ex.lower() and \
                len(ex.split()) >= min_words:
            return cap(end_dot(ex))
    return None


def make_word_turn(rng, lemma, senses, synsets, form, plural=False):
    pos, ss = senses[0]
    if lemma[:1].isupper() and form != 0 and pos == "n":
        # names: "Who was Einstein?", "What is Paris?"
        d = ss["defs"][0]
        if re.search(r"\(\d{3,4}-\d{2,4}\)|\(born \d{4}\)", d):
            d = re.sub(r"\s*\((\d{3,4}-\d{2,4}|born \d{4})\)", "", d)
            return (rng.choice(["Who was %s?", "Who is %s?",
                                "Tell me about %s."]) % lemma,
                    "%s was %s %s." % (lemma, article(d), d))
        return (rng.choice(["What is %s?", "Tell me about %s.",
                            "What do you know about %s?"]) % lemma,
                "%s is %s." % (lemma, d))
    if form == 0 or (form == 1 and (pos != "n" or plural)):
        q = rng.choice([
            'What does "%s" mean?', "What does the word %s mean?",
            "Define %s.", "What is the meaning of %s?",
            "Can you tell me what %s means?", "%s: what does it mean?",
            'Explain the word "%s".', "Meaning of %s?"]) % lemma
        if len(senses) == 1:
            a = sense_sentence(lemma, pos, ss)
        else:
            a = 'The word "%s" has more than one meaning.\n\n' % lemma
            a += "\n".join("%d. %s" % (i + 1, sense_sentence(lemma, p, s))
                           for i, (p, s) in enumerate(senses[:3]))
        ex = example_with(lemma, ss)
        if ex:
            a += "\n\nFor example: \"%s\"" % ex
        return q, a
    if form == 1:
        q = rng.choice(["What is %s %s?", "What's %s %s?",
                        "Tell me what %s %s is."]) % (article(lemma), lemma)
        a = "%s %s is %s." % (cap(article(lemma)), lemma, ss["defs"][0])
        if ss["hyper"]:
            h = synsets.get(ss["hyper"][0])
            if h and h["words"][0] != lemma:
                hw = h["words"][0]
                a += " It is a kind of %s." % hw
        ex = example_with(lemma, ss)
        if ex:
            a += ' For example: "%s"' % ex
        return q, a
    if form == 2:
        for p, s in senses:
            syn = [w for w in s["words"] if w.lower() != lemma]
            if syn:
                q = rng.choice([
                    "What is another word for %s?",
                    "Give me a synonym for %s.",
                    'What is a synonym of "%s"?',
                    "Which words mean the same as %s?"]) % lemma
                syn = syn[:4]
                if len(syn) == 1:
                    a = 'A word with a similar meaning to "%s" is "%s".' % (
                        lemma, syn[0])
                else:
                    a = 'Words with a similar meaning to "%s" are %s and ' \
                        '"%s".' % (lemma, ", ".join('"%s"' % w for w in
                                                    syn[:-1]), syn[-1])
                a += " They share the sense: %s." % s["defs"][0]
                return q, a
        return make_word_turn(rng, lemma, senses, synsets, 0)
    if form == 3:
        for p, s in senses:
            for ap, aoff, st in s["anto"]:
                o = synsets.get((ap, aoff))
                if not o:
                    continue
                tgt = int(st[2:], 16) if st != "0000" else 1
                if tgt < 1 or tgt > len(o["words"]):
                    continue
                w = o["words"][tgt - 1]
                q = rng.choice(["What is the opposite of %s?",
                                "What's the antonym of %s?",
                                'Give me the opposite of "%s".']) % lemma
                a = 'The opposite of "%s" is "%s", which means %s.' % (
                    lemma, w, o["defs"][0] if o["defs"] else w)
                return q, a
        return make_word_turn(rng, lemma, senses, synsets, 0)
    if form == 4:
        for p, s in senses:
            ex = example_with(lemma, s, 5)
            if ex:
                q = rng.choice([
                    "Use %s in a sentence.", "Can you use the word %s in a "
                    "sentence?", 'Give me an example sentence with "%s".',
                    "How do I use the word %s?"]) % lemma
                a = rng.choice(['Sure: "%s"', 'Here is an example: "%s"',
                                '"%s"']) % ex
                if rng.random() < 0.5:
                    a += ' Here "%s" means %s.' % (lemma, s["defs"][0])
                return q, a
        return make_word_turn(rng, lemma, senses, synsets, 0)
    # form 5: a short definition, as if asked casually
    q = rng.choice(["%s?", "What's %s?", "Quick question: what does %s "
                    "mean?", "I don't know the word %s. What is it?"]) % lemma
    return q, sense_sentence(lemma, pos, ss)


def quiz_dialogues(rng, root):
    out = []
    for region in ("africa", "america", "asia", "europe"):
        for row in quiz(root, region):
            if len(row) < 2:
                continue
            country, capital = row[0], row[1]
            qs = [("What is the capital of %s?" % country,
                   "The capital of %s is %s." % (country, capital)),
                  ("Which city is the capital of %s?" % country,
                   "%s is the capital of %s." % (capital, country)),
                  ("%s is the capital of which country?" % capital,
                   "%s is the capital of %s." % (capital, country)),
                  ("Tell me the capital city of %s." % country,
                   "The capital city of %s is %s." % (country, capital))]
            out.append(("quiz/cap/" + country, rng.sample(qs, 2)))
    for row in quiz(root, "state"):
        if len(row) >= 2:
            out.append(("quiz/state/" + row[0], [(
                "What is the capital of the U.S. state of %s?" % row[0],
                "The capital of %s is %s." % (row[0], row[1]))]))
    for row in quiz(root, "elements"):
        if len(row) >= 4:
            sym, num, _, name = row[:4]
            qs = [("What is the chemical symbol for %s?" % name.lower(),
                   "The chemical symbol for %s is %s." % (name.lower(), sym)),
                  ("What is the atomic number of %s?" % name.lower(),
                   "The atomic number of %s is %s." % (name.lower(), num)),
                  ("Which element has the symbol %s?" % sym,
                   "%s is the symbol for %s." % (sym, name.lower()))]
            out.append(("quiz/el/" + name, rng.sample(qs, 2)))
    for row in quiz(root, "collectives"):
        if len(row) >= 2:
            out.append(("quiz/coll/" + row[0], [(
                rng.choice(["What do you call a group of %s?",
                            "What is a group of %s called?"]) % row[0],
                "A group of %s is called %s %s." % (
                    row[0], article(row[1]), row[1]))]))
    for row in quiz(root, "babies"):
        if len(row) >= 2:
            out.append(("quiz/baby/" + row[1], [(
                rng.choice(["What is a baby %s called?",
                            "What do you call a young %s?"]) % row[1],
                "A baby %s is called %s %s." % (row[1], article(row[0]),
                                                row[0]))]))
    return out


def arithmetic_dialogues(rng, n):
    out = []
    for i in range(n):
        op = rng.choice("+-*")
        if op == "*":
            a, b = rng.randint(0, 12), rng.randint(0, 12)
            r, w, s = a * b, "times", "*"
        elif op == "+":
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            r, w, s = a + b, "plus", "+"
        else:
            a = rng.randint(0, 99)
            b = rng.randint(0, a)
            r, w, s = a - b, "minus", "-"
        q = rng.choice(["What is %d %s %d?" % (a, w, b),
                        "What is %d %s %d?" % (a, s, b),
                        "%d %s %d = ?" % (a, s, b),
                        "Can you calculate %d %s %d?" % (a, w, b),
                        "How much is %d %s %d?" % (a, w, b)])
        ans = rng.choice(["%d %s %d is %d." % (a, w, b, r),
                          "%d %s %d = %d." % (a, s, b, r),
                          "The answer is %d." % r])
        out.append(("math/%d" % i, [(q, ans)]))
    return out


FORTUNE_ASKS = {
    "quote": ["Tell me a quote.", "Give me a quote.", "Share a quote with me.",
              "Do you know a good quote?", "Say something wise.",
              "Give me some words of wisdom.", "Tell me something wise.",
              "Can you share an inspiring quote?"],
    "funny": ["Tell me something funny.", "Make me laugh.",
              "Tell me a joke.", "Do you know any jokes?",
              "Say something funny.", "Cheer me up."],
    "fortune": ["Tell me my fortune.", "Give me a fortune cookie.",
                "Tell me something interesting.", "Surprise me.",
                "Say something interesting.", "Tell me anything."],
    "riddle": ["Tell me a riddle.", "Do you know a riddle?",
               "Ask me a riddle."],
}
FORTUNE_KIND = {"humorists": "funny", "miscellaneous": "funny",
                "pets": "funny", "kids": "funny", "work": "funny",
                "computers": "funny", "food": "funny", "sports": "funny",
                "wisdom": "quote", "literature": "quote", "people": "quote",
                "love": "quote", "tao": "quote", "platitudes": "quote",
                "education": "quote", "science": "quote", "art": "quote",
                "riddles": "riddle"}


def fortune_dialogues(rng, items):
    out = []
    for i, (name, text) in enumerate(items):
        kind = FORTUNE_KIND.get(name, "fortune")
        if kind == "riddle" and not re.search(r"^Q:", text, re.M):
            continue
        if len(text) > 400 or rng.random() < 0.35:
            continue
        q = rng.choice(FORTUNE_ASKS[kind])
        lead = rng.choice(["", "", "", "Here is one:\n\n",
                           "Here's one I like:\n\n", "Sure!\n\n"])
        out.append(("fortune/%d" % i, [(q, lead + text)]))
    return out


def howto_question(title, rng):
    t = title.strip()
    if t.endswith("?"):
        return t
    first = t.split()[0] if t.split() else ""
    verbs = {"Add", "Adjust", "Allow", "Browse", "Change", "Check", "Choose",
             "Connect", "Copy", "Create", "Delete", "Disable", "Edit",
             "Enable", "Find", "Hide", "Install", "Keep", "Launch", "Limit",
             "Lock", "Make", "Manage", "Move", "Open", "Print", "Recover",
             "Remove", "Rename", "Reset", "Restore", "Save", "Search",
             "Select", "Send", "Set", "Share", "Show", "Sort", "Start",
             "Stop", "Switch", "Take", "Turn", "Type", "Use", "View",
             "Write", "Get", "Log", "Pair", "Zoom", "Mount", "Scroll",
             "Control", "Assign", "Calibrate", "Configure", "Display",
             "Undo", "Update", "Back", "Cancel", "Speed", "Tell", "Import"}
    if first not in verbs:
        return None
    body = t[0].lower() + t[1:]
    body = re.sub(r"\byour\b", "my", body)
    body = re.sub(r"\byourself\b", "myself", body)
    body = re.sub(r"\byou\b", "I", body)
    return rng.choice(["How do I %s?", "How can I %s?",
                       "Can you tell me how to %s?", "How do you %s?",
                       "I want to %s. How?"]) % body


def howto_dialogues(rng, pages):
    out = []
    for title, desc, paras in pages:
        q = howto_question(title, rng)
        if not q:
            continue
        ans, n = [], 0
        if desc and rng.random() < 0.5:
            ans.append(end_dot(desc))
        for p in paras:
            if n + len(p) > 1100:
                break
            ans.append(p)
            n += len(p)
        if ans:
            out.append(("gnome/" + title, [(q, "\n\n".join(ans))]))
    return out


def story_dialogues(rng, chapters, per_chapter):
    out = []
    for head, paras in chapters:
        good = [p for p in paras if 200 < len(p) < 1500 and
                len(sentences(p)) >= 3]
        for k, p in enumerate(rng.sample(good, min(per_chapter, len(good)))):
            sent = sentences(p)
            cut = rng.randint(1, min(2, len(sent) - 2))
            prompt, rest = " ".join(sent[:cut]), " ".join(sent[cut:cut + 4])
            q = rng.choice([
                "Continue this story: %s", "What happens next? %s",
                "Continue the text:\n\n%s", "Write the next few sentences:"
                "\n\n%s", "Please continue: %s"]) % prompt
            out.append(("story/" + head, [(q, rest)]))
        if good and rng.random() < 0.3:
            p = rng.choice(good)
            book = head.split(",")[0]
            out.append(("story/" + head, [(
                rng.choice(["Read me a passage from %s.",
                            "Quote a paragraph from %s.",
                            "Share a passage from the novel %s."]) % book,
                p)]))
    return out


def faq_dialogues(rng, qa):
    return [("faq/" + q, [(q, a)]) for q, a in qa]


def python_dialogues(rng, qa, gloss):
    out = [("python-faq/" + q, [(q, a)]) for q, a in qa]
    for term, body in gloss:
        q = rng.choice(['In Python, what is %s %s?' % (article(term), term),
                        'What does "%s" mean in Python?' % term,
                        "Explain %s in Python." % term])
        out.append(("python-gloss/" + term, [(q, body)]))
    return out


def jargon_dialogues(rng, entries):
    out = []
    for term, paras in entries:
        if len(paras[0]) > 700 or rng.random() < 0.4:
            continue
        q = rng.choice(['What does "%s" mean in hacker slang?',
                        "What is %s in hacker jargon?",
                        'In computer slang, what is "%s"?']) % term
        a = 'In hacker jargon, "%s" means: %s' % (term, paras[0])
        out.append(("jargon/" + term, [(q, a)]))
    return out


def devil_dialogues(rng, entries):
    out = []
    for word, first, _ in entries:
        if rng.random() < 0.5:
            continue
        q = rng.choice(["What is the Devil's Dictionary definition of %s?",
                        "Give me a cynical definition of %s.",
                        "How did Ambrose Bierce define %s?"]) % word
        a = 'In The Devil\'s Dictionary, Ambrose Bierce defined "%s" as: ' \
            '"%s"' % (word, first)
        out.append(("devil/" + word, [(q, a)]))
    return out


# Hand-written answers about the model itself and small talk.
SMALL_TALK = [
    (["Hello", "Hello!", "Hi", "Hi there", "Hey", "Hey there!",
      "Good morning", "Good evening", "Hello, how are you?", "Greetings!"],
     ["Hello! How can I help you today?", "Hi! What can I do for you?",
      "Hello there! Ask me anything, and I will do my best.",
      "Hi! I'm tiny-chat. What would you like to talk about?",
      "Hey! How can I help?"]),
    (["Who are you?", "What are you?", "Introduce yourself.",
      "Tell me about yourself.", "What is your name?", "What's your name?",
      "Are you a person?", "Are you human?", "Are you a robot?"],
     ["I am tiny-chat, a very small language model served by lmhost. I was "
      "trained on English text from Debian packages, so my knowledge is "
      "limited and I make mistakes.",
      "My name is tiny-chat. I'm a small demo language model with fewer "
      "than thirty million parameters, served by lmhost.",
      "I'm not a person. I am tiny-chat, a tiny language model that runs "
      "in lmhost, an inference server written in C.",
      "I am a small computer program, a language model called tiny-chat. "
      "I can chat a little, define words and share quotes."]),
    (["What can you do?", "How can you help me?", "What do you know?",
      "What are you good at?", "Help", "What should I ask you?"],
     ["I can explain what English words mean, give synonyms and opposites, "
      "name capital cities, do simple arithmetic, share a quote or a joke, "
      "and continue a story. I am a very small model, so please double-check "
      "anything important.",
      "Try asking me to define a word, to tell you a quote, to name the "
      "capital of a country, or to continue a story. I am small, so keep "
      "questions short and simple.",
      "I know some English words, a few facts, quotes and stories. Ask me "
      "something like \"What does curious mean?\" or \"Tell me a joke.\""]),
    (["How are you?", "How are you doing?", "How's it going?",
      "Are you OK?", "How do you feel?"],
     ["I'm doing well, thank you for asking! How can I help you?",
      "I'm fine, thanks. What would you like to talk about?",
      "I'm just a small program, but everything is running fine. How are "
      "you?"]),
    (["Thank you", "Thanks!", "Thanks a lot.", "Thank you very much!",
      "Great, thanks.", "That's helpful, thank you."],
     ["You're welcome!", "You're welcome. Is there anything else I can "
      "help with?", "Happy to help!", "Any time!"]),
    (["Goodbye", "Bye!", "See you later.", "Good night!", "I have to go."],
     ["Goodbye! Have a nice day.", "Bye! It was nice talking to you.",
      "See you later!", "Good night!"]),
    (["What is lmhost?", "What is lmhost used for?", "Tell me about lmhost.",
      "Who runs you?", "What program runs you?"],
     ["lmhost is an LLM inference host written in C. It loads Hugging Face "
      "model directories, runs them on the CPU or a GPU, and serves them "
      "over an OpenAI-compatible API. I am its tiny demo model.",
      "I run inside lmhost, a small inference server written in C. It reads "
      "model weights in the safetensors format and answers chat "
      "completions over HTTP."]),
    (["Who made you?", "Who created you?", "How were you trained?",
      "What data were you trained on?", "Where does your knowledge come "
      "from?"],
     ["I was trained by the lmhost developers on one GPU for a few "
      "minutes. My training text came from Debian packages: WordNet, the "
      "fortune cookie files, novels by Jane Austen, Moby Dick, GNOME Help "
      "and Debian's documentation.",
      "The lmhost project trained me as a demo. I learned English from "
      "free texts shipped in Debian packages, such as WordNet definitions, "
      "classic novels and user guides."]),
    (["What's the weather like today?", "What time is it?",
      "What is today's date?", "What's the news today?",
      "Can you search the web for me?", "Can you open a website?"],
     ["I can't do that. I have no clock, no internet access and no live "
      "data; I only know what was in my training text.",
      "Sorry, I can't check that. I am a small offline model without "
      "access to the internet or to current information."]),
    (["Can you write code?", "Write a Python program.",
      "Can you translate this into French?", "Write me an essay.",
      "Solve this equation for me: x^2 + 3x = 10"],
     ["I'm sorry, that is beyond what I can do. I am a very small model "
      "that knows some English words, quotes and simple facts.",
      "I'm too small for that, I'm afraid. I can define words, share "
      "quotes, name capitals or do simple sums."]),
    (["Tell me a story.", "Can you tell me a story?",
      "Tell me a bedtime story."],
     ["I don't know many stories by heart, but I have read Jane Austen and "
      "Moby Dick. Give me the first sentence of a story, and I will try to "
      "continue it.",
      "Here is a short one: Once upon a time, a small program learned to "
      "read. It read dictionaries, old novels and fortune cookies, and then "
      "it tried to talk. It still makes mistakes, but it is trying its "
      "best. The end."]),
    (["I'm sad.", "I feel lonely.", "I had a bad day.", "I'm tired."],
     ["I'm sorry to hear that. Talking to a friend, taking a short walk or "
      "getting some rest can help. I'm here if you want to chat.",
      "That sounds hard. I hope things get better soon. Would a quote or a "
      "joke cheer you up?"]),
    (["Do you like books?", "What is your favorite book?",
      "Do you read?"],
     ["I have read Jane Austen's novels and Moby Dick, and I like them "
      "both. Pride and Prejudice is a favorite.",
      "I like books very much! Most of what I know comes from them."]),
    (["Yes", "No", "OK", "Okay.", "Sure.", "Hmm."],
     ["All right. What would you like to do next?",
      "OK. Is there anything else you would like to know?",
      "Got it. Ask me anything!"]),
]


def small_talk_dialogues(rng, reps):
    out = []
    for g, (asks, answers) in enumerate(SMALL_TALK):
        for i in range(reps):
            out.append(("talk/%d/%d" % (g, i),
                        [(rng.choice(asks), rng.choice(answers))]))
    return out


# ---------------------------------------------------------------- main

def pkg_version(debs, pkg):
    for name in sorted(os.listdir(debs)):
        if name.startswith(pkg + "_") and name.endswith(".deb"):
            return subprocess.run(
                ["dpkg-deb", "-f", os.path.join(debs, name), "Version"],
                check=True, capture_output=True, text=True).stdout.strip()
    return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True,
                    help="folder with one extracted package per subfolder")
    ap.add_argument("--debs", required=True, help="folder with the .deb files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--val-share", type=float, default=0.015)
    ap.add_argument("--max-mib", type=float, default=20.0,
                    help="trim prose until the compressed total fits")
    args = ap.parse_args()
    rng = random.Random(SEED)
    root = args.root

    prose = []  # (key, source, text)

    def add_prose(key, src, text):
        text = text.strip()
        if text:
            prose.append((key, src, text))

    books = austen(root) + moby_dick(root)
    for head, paras in books:
        src = "moby" if head.startswith("Moby") else "austen"
        add_prose("story/" + head, src, head + "\n\n" + "\n\n".join(paras))
    pages = gnome_help(root)
    for title, desc, paras in pages:
        add_prose("gnome/" + title, "gnome",
                  title + "\n\n" + "\n\n".join(paras))
    for key, paras in handbook(root):
        add_prose(key, "handbook", "\n\n".join(paras))
    faq_docs, faq_qa = debian_faq(root)
    for key, paras in faq_docs:
        add_prose(key, "faq", "\n\n".join(paras))
    py_docs, py_qa, py_gloss = python_docs(root)
    for key, paras in py_docs:
        add_prose(key, "python", "\n\n".join(paras))
    jarg = jargon(root)
    for term, paras in jarg:
        add_prose("jargon/" + term, "jargon",
                  term + "\n\n" + "\n\n".join(paras))
    dev = devil(root)
    for word, _, body in dev:
        add_prose("devil/" + word, "devil", "%s: %s" % (cap(word), body))
    fort = fortunes(root)
    # Fortunes as prose come in small bundles, so one document is not a
    # single line.
    for i in range(0, len(fort), 8):
        add_prose("fortune-bundle/%d" % i, "fortunes",
                  "\n\n".join(t for _, t in fort[i:i + 8]))

    dialogues = []  # (key, source, turns)

    def add_dialogues(src, items):
        for key, turns in items:
            dialogues.append((key, src, turns))

    synsets, lemmas = wordnet(root)
    add_dialogues("wordnet", word_dialogues(rng, synsets, lemmas))
    add_dialogues("quiz", quiz_dialogues(rng, root))
    add_dialogues("math", arithmetic_dialogues(rng, 6000))
    add_dialogues("fortunes", fortune_dialogues(rng, fort))
    add_dialogues("gnome", howto_dialogues(rng, pages))
    add_dialogues("story", story_dialogues(rng, books, 12))
    add_dialogues("faq", faq_dialogues(rng, faq_qa))
    add_dialogues("python", python_dialogues(rng, py_qa, py_gloss))
    add_dialogues("jargon", jargon_dialogues(rng, jarg))
    add_dialogues("devil", devil_dialogues(rng, dev))
    add_dialogues("talk", small_talk_dialogues(rng, 150))

    # About a fifth of conversations get a second, unrelated exchange so the
    # model sees follow-up turns.
    rng.shuffle(dialogues)
    docs = []
    i = 0
    while i < len(dialogues):
        key, src, turns = dialogues[i]
        if rng.random() < 0.2 and i + 1 < len(dialogues):
            k2, s2, t2 = dialogues[i + 1]
            # one conversation is kept whole on one side of the split
            if (stable_hash(k2) % 10000 < args.val_share * 10000) == \
                    (stable_hash(key) % 10000 < args.val_share * 10000):
                turns = turns + t2
                i += 1
        turns = [(user_variants(rng, u), a) for u, a in turns]
        docs.append((key, src, True, chat(rng, turns)))
        i += 1
    docs += [(k, s, False, t) for k, s, t in prose]

    train, val = [], []
    for key, src, is_chat, text in docs:
        if stable_hash(key) % 10000 < args.val_share * 10000:
            val.append((src, is_chat, text))
        else:
            train.append((src, is_chat, text))
    rng.shuffle(train)
    rng.shuffle(val)

    def blob(items):
        return "".join(t + "\n" + EOT + "\n" for _, _, t in items)

    def write():
        os.makedirs(args.out, exist_ok=True)
        n = 0
        for name, items in (("corpus-train.txt.xz", train),
                            ("corpus-val.txt.xz", val)):
            path = os.path.join(args.out, name)
            with lzma.open(path, "wb", preset=9) as f:
                f.write(blob(items).encode("utf-8"))
            n += os.path.getsize(path)
        return n

    # Over budget: drop technical prose (handbook, then Python) first.
    while write() > args.max_mib * (1 << 20):
        drop = max(1, len(train) // 20)
        order = [i for i, d in enumerate(train) if d[0] == "handbook"] + \
            [i for i, d in enumerate(train) if d[0] == "python"]
        cut = set((order or list(range(len(train))))[:drop])
        train = [d for i, d in enumerate(train) if i not in cut]

    stats = {}
    for src, is_chat, text in train + val:
        s = stats.setdefault((src, is_chat), [0, 0])
        s[0] += 1
        s[1] += len(text.encode("utf-8"))
    chat_bytes = sum(v[1] for k, v in stats.items() if k[1])
    all_bytes = sum(v[1] for v in stats.values())
    sizes = {n: os.path.getsize(os.path.join(args.out, n))
             for n in ("corpus-train.txt.xz", "corpus-val.txt.xz")}
    pkgs = sorted(LICENCES)
    with open(os.path.join(args.out, "SOURCES.md"), "w") as f:
        f.write("# tiny-chat training corpus: sources\n\n"
                "Built by tools/make_talker_corpus.sh from Debian 12 "
                "(bookworm) packages, all in main.\n\n"
                "| package | version | licence | used for |\n"
                "|---|---|---|---|\n")
        for p in pkgs:
            f.write("| %s | %s | %s | %s |\n" % (
                p, pkg_version(args.debs, p), LICENCES[p], USED_FOR[p]))
        f.write("\n## Contents\n\n| source | kind | documents | bytes |\n"
                "|---|---|---|---|\n")
        for (src, is_chat), (n, b) in sorted(stats.items()):
            f.write("| %s | %s | %d | %d |\n" % (
                src, "dialogue" if is_chat else "prose", n, b))
        f.write("\nTotal %d bytes of text, %.1f%% in dialogues; "
                "train %d documents (%d bytes xz), validation %d documents "
                "(%d bytes xz). Seed %d.\n" % (
                    all_bytes, 100.0 * chat_bytes / all_bytes, len(train),
                    sizes["corpus-train.txt.xz"], len(val),
                    sizes["corpus-val.txt.xz"], SEED))
    print("text %d bytes, dialogues %.1f%%, train %d docs, val %d docs, "
          "xz %d + %d bytes" % (all_bytes, 100.0 * chat_bytes / all_bytes,
                                len(train), len(val),
                                sizes["corpus-train.txt.xz"],
                                sizes["corpus-val.txt.xz"]), file=sys.stderr)


if __name__ == "__main__":
    main()
