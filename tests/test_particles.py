"""Korean particles after a rendered value: digits, Latin letters and Hangul read as a Korean speaker reads them."""

from __future__ import annotations

import pytest

from release.publish.card.particles import Text, final_sound, particle, resolve

# The Sino-Korean reading of each digit and the sound it ends in: 영 일 이 삼 사 오 육 칠 팔 구.
DIGITS = {"0": "consonant", "1": "rieul", "2": "vowel", "3": "consonant", "4": "vowel", "5": "vowel",
          "6": "consonant", "7": "rieul", "8": "rieul", "9": "vowel"}


@pytest.mark.parametrize(("digit", "sound"), DIGITS.items())
def test_each_digit_ends_in_its_korean_reading(digit: str, sound: str) -> None:
    assert final_sound(digit) == sound
    assert final_sound(f"0.{digit}") == sound  # decimals are read digit by digit
    assert final_sound(f"1{digit}") == (sound if digit != "0" else "consonant")  # 10 십


@pytest.mark.parametrize(("number", "reading"), [
    ("10", "십"), ("20", "이십"), ("100", "백"), ("1000", "천"), ("1,000", "천"), ("1010", "천십"),
    ("10000", "만"), ("10,000", "만"), ("120000", "십이만"), ("100000000", "억"), ("12", "십이"), ("256", "이백오십육"),
])
def test_numbers_end_in_their_last_unit(number: str, reading: str) -> None:
    assert final_sound(number) == final_sound(reading)


@pytest.mark.parametrize(("word", "marker", "expected"), [
    ("FP8", "과(와)", "FP8과"),  # 팔
    ("RTN", "과(와)", "RTN과"),  # 엔
    ("GPTQ", "과(와)", "GPTQ와"),  # 큐
    ("AWQ", "을(를)", "AWQ를"),
    ("BF16", "은(는)", "BF16은"),  # 육
    ("E4M3", "이(가)", "E4M3이"),  # 삼
    ("SQ", "이(가)", "SQ가"),
    ("L", "을(를)", "L을"),  # 엘
    ("SmoothQuant", "은(는)", "SmoothQuant는"),  # 스무스퀀트
    ("ModelOpt", "을(를)", "ModelOpt를"),  # 모델옵트
    ("diffusers", "과(와)", "diffusers와"),  # 디퓨저스
    ("model", "이(가)", "model이"),  # 모델
    ("beam", "이(가)", "beam이"),
    ("빌드", "은(는)", "빌드는"),
    ("값", "은(는)", "값은"),
    ("레시피", "과(와)", "레시피와"),
    ("0.1.0", "(으)로", "0.1.0으로"),  # the "0.1.0로"
    ("`Cosmos3-Nano-Policy-DROID-FP8`", "과(와)", "`Cosmos3-Nano-Policy-DROID-FP8`과"),  # the "…FP8`와"
    ("(전달)", "이(가)", "(전달)이"),
    ("0.5%", "이(가)", "0.5%가"),  # 퍼센트
])
def test_particle_after_a_value(word: str, marker: str, expected: str) -> None:
    assert particle(word, marker) == expected


@pytest.mark.parametrize(("word", "form"), [
    ("1", "로"), ("7", "로"), ("8", "로"), ("L", "로"), ("달", "로"), ("model", "로"),  # ㄹ: 로, as after a vowel
    ("2", "로"), ("빌드", "로"), ("GPTQ", "로"),  # a vowel
    ("3", "으로"), ("0.1.0", "으로"), ("RTN", "으로"), ("값", "으로"), ("책", "으로"),  # another consonant
])
def test_ro_takes_ro_after_rieul(word: str, form: str) -> None:
    assert particle(word, "(으)로") == word + form


def test_hangul_final_comes_from_the_syllable_code() -> None:
    """(code - 0xAC00) % 28: 0 is no final, 8 is ㄹ; checked on every syllable of a few rows of the table."""
    for code in range(0xAC00, 0xAC00 + 28 * 40):
        final = (code - 0xAC00) % 28
        assert final_sound(chr(code)) == ("vowel" if final == 0 else "rieul" if final == 8 else "consonant")


def test_unknown_sound_keeps_both_forms() -> None:
    assert particle("?", "을(를)") == "?을(를)" and particle("", "이(가)") == "이(가)"


def test_messages_resolve_their_markers_once_formatted() -> None:
    assert Text("`release` {version}(으)로 만들었습니다").format(version="0.1.0") == "`release` 0.1.0으로 만들었습니다"
    assert Text("%(build)s과(와) %(ref)s을(를) 비교") % {"build": "GPTQ", "ref": "RTN"} == "GPTQ와 RTN을 비교"
    assert resolve("RTN이(가) 아닌 AWQ이(가)") == "RTN이 아닌 AWQ가"


def test_card_templates_have_the_particle_filter() -> None:
    from release.publish.card.i18n import TEMPLATES, environment, translations

    env = environment(translations("ko"), TEMPLATES)
    assert env.from_string("{{ x|particle('을(를)') }}, {{ y|particle('(으)로') }}").render(x="RTN", y=10) == \
        "RTN을, 10으로"
