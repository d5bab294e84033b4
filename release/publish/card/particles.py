"""Korean particles after a rendered value, and brackets for parentheses within parentheses.

A Korean particle has two forms, chosen by the sound the word before it ends in: 은/는, 이/가, 을/를, 과/와 take
their first form after a final consonant, and 으로/로 takes 로 after a vowel or after ㄹ as well. A value rendered
into a translated message (a version, a build title, a code span, a count) is read aloud as Korean speakers read
it: digits as Sino-Korean numbers (``10`` 십, ``0.1.0`` ...영), capital abbreviations letter by letter (``RTN`` ...엔,
``GPTQ`` ...큐), other Latin words as they are pronounced (``ModelOpt`` ...트, ``model`` ...델).

The catalog writes a particle after a placeholder in its traditional two-form spelling, ``{build}을(를)``,
``%(version)s(으)로``; :class:`Text` resolves each such marker from the rendered text before it, and templates call
:func:`particle` as the ``particle`` filter.
"""

from __future__ import annotations

import re
from typing import Any, Literal

Sound = Literal["vowel", "rieul", "consonant"]

# marker -> (form after a final consonant, form after a vowel); 으로/로 also takes 로 after ㄹ
FORMS = {"은(는)": ("은", "는"), "이(가)": ("이", "가"), "을(를)": ("을", "를"), "과(와)": ("과", "와"),
         "(으)로": ("으로", "로")}
MARKER = re.compile("|".join(re.escape(m) for m in FORMS))

DIGITS = "영일이삼사오육칠팔구"
TENS = {1: "십", 2: "백", 3: "천"}  # 10, 100, 1000
MYRIADS = "만억조경"  # 10^4, 10^8, 10^12, 10^16: 120,000 is 십이만, read with 만 last
# the last syllable of each Latin letter's Korean name (에이, 비, 씨, ..., 엘, 엠, 엔, ..., 알, ...)
LETTERS = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "이비씨디이프지치이이이엘엠엔오피큐알스티유이유스이트", strict=True))
SYMBOLS = {"%": "트", "σ": "마", "∞": "대", "°": "도"}  # 퍼센트, 시그마, 무한대, 도
CLOSING = ")]}`'\"*_”’»」』"  # read through: the sound is the enclosed word's
NUMBER = re.compile(r"[0-9][0-9,.]*$")
LATIN = re.compile(r"[A-Za-z]+$")


def _hangul(syllable: str) -> Sound:
    """A precomposed Hangul syllable's final: (code - 0xAC00) % 28 is 0 without one, 8 for ㄹ."""
    final = (ord(syllable) - 0xAC00) % 28
    return "vowel" if final == 0 else "rieul" if final == 8 else "consonant"


def _number(digits: str) -> str:
    """The last syllable of a number read in Sino-Korean: decimals digit by digit after the point, integers by their
    trailing zeros (10 십, 100 백, 1000 천, 10,000 만, 10^8 억)."""
    digits = digits.rstrip(".,")
    if "." in digits:
        return DIGITS[int(digits[-1])]
    whole = digits.replace(",", "")
    zeros = len(whole) - len(whole.rstrip("0"))
    if zeros == len(whole):
        return DIGITS[0]
    if zeros == 0:
        return DIGITS[int(whole[-1])]
    return TENS[zeros] if zeros < 4 else MYRIADS[min(zeros // 4, len(MYRIADS)) - 1]


def _latin(word: str) -> Sound:
    """A capital abbreviation (or one letter) ends in its last letter's name; another word in its pronunciation,
    approximated by its last letters: -l as ㄹ, -m, -n, -ng as consonants, anything else (-t 트, -d 드, -s 스, -r 어,
    -e, -y) as a vowel."""
    if len(word) == 1 or word.isupper():
        return _hangul(LETTERS[word[-1].upper()])
    last = word[-1].lower()
    return "rieul" if last == "l" else "consonant" if last in "mn" or word.lower().endswith("ng") else "vowel"


PAIRS = {")": "(", "]": "["}


def _before_aside(text: str) -> str:
    """``text`` without the asides in Latin letters, digits and symbols it ends in (``에뮬레이션 (torch 2.13.0+cpu)``
    is ``에뮬레이션``): a version or gloss is not read aloud, and the particle after it agrees with the word before it,
    as Korean orthography has it. An aside in Korean words is read (``FP8 (RTN, NVIDIA와 같은 레시피)``: after
    레시피), and so is one with nothing before it (``(전달)``, a link's ``[text]``)."""
    while text and text[-1] in PAIRS:
        close, depth, start = text[-1], 0, None
        for i in range(len(text) - 1, -1, -1):
            depth += 1 if text[i] == close else -1 if text[i] == PAIRS[close] else 0
            if depth == 0:
                start = i
                break
        if start is None or not text[:start].strip() or any("가" <= c <= "힣" for c in text[start:]):
            return text
        text = text[:start].rstrip()
    return text


def outer_brackets(text: str) -> str:
    """Parentheses within parentheses with the outer pair written as brackets, as Korean orthography has it
    (``(캘리브레이션 랩 (표본 내))`` is ``[캘리브레이션 랩 (표본 내)]``). Code spans and a link's target (``](...)``)
    are left as they are."""
    out = list(text)
    opened: list[list[int]] = []  # [index, whether it holds another pair] of each open parenthesis
    code, target = False, 0  # inside a code span; the depth inside a link's target
    for i, c in enumerate(text):
        if c == "`":
            code = not code
        elif code:
            continue
        elif target:
            target += 1 if c == "(" else -1 if c == ")" else 0
        elif c == "(" and i and text[i - 1] == "]":
            target = 1
        elif c == "(":
            if opened:
                opened[-1][1] = 1
            opened.append([i, 0])
        elif c == ")" and opened:
            start, holds = opened.pop()
            if holds:
                out[start], out[i] = "[", "]"
    return "".join(out)


def final_sound(text: str) -> Sound | None:
    """How ``text`` ends when read aloud: after a vowel, after ㄹ, or after another consonant, a parenthetical aside at
    its end passed over; None when its last character is none of a Hangul syllable, a digit, a Latin letter or a
    known symbol."""
    text = _before_aside(text).rstrip(CLOSING)
    if not text:
        return None
    last = text[-1]
    if "가" <= last <= "힣":
        return _hangul(last)
    if last in SYMBOLS:
        return _hangul(SYMBOLS[last])
    number = NUMBER.search(text)
    if number:
        return _hangul(_number(number.group()))
    latin = LATIN.search(text)
    return _latin(latin.group()) if latin else None


def particle(word: Any, marker: str) -> str:
    """``word`` followed by the form of ``marker``'s particle that its final sound takes (``particle("RTN", "과(와)")``
    is ``"RTN과"``); the marker itself, both forms, when the sound is unknown. The ``particle`` filter of the card
    templates."""
    text = str(word)
    return text + _form(text, marker)


def _form(before: str, marker: str) -> str:
    sound = final_sound(before)
    if sound is None:
        return marker
    consonant, vowel = FORMS[marker]
    if marker == "(으)로":
        return consonant if sound == "consonant" else vowel
    return vowel if sound == "vowel" else consonant


def resolve(text: str) -> str:
    """Every particle marker in ``text`` in the form the text before it takes, then :func:`outer_brackets`."""
    return outer_brackets(MARKER.sub(lambda m: _form(m.string[:m.start()], m.group()), text))


class Text(str):
    """A translated message whose particle markers are resolved once its placeholders are filled, by ``format``
    (the Python side's messages) and by ``%`` (Jinja's ``trans`` blocks format their message with it)."""

    def format(self, *args: object, **kwargs: object) -> str:
        return resolve(str.format(self, *args, **kwargs))

    def __mod__(self, values: Any) -> str:
        return resolve(str.__mod__(self, values))
