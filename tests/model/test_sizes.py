import pytest

from jupyter_vgpu.model import SliceValueError, format_size, parse_device, parse_policy, parse_size, parse_sm_share


@pytest.mark.parametrize(
    "text, expected",
    [
        ("512MiB", 512 << 20),
        ("4GiB", 4 << 30),
        ("4G", 4 << 30),
        ("4gb", 4 << 30),
        ("1.5GiB", 3 << 29),
        ("4096", 4096 << 20),
        (4096, 4096 << 20),
        (" 2 TiB ", 2 << 40),
        ("1024KiB", 1 << 20),
    ],
)
def test_sizes_accept_units_and_bare_mib(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["", "lots", "4 GiBs", "-1G", "0", "0MiB", "1e3", "GiB", True, "1\u212aiB", "1\u212a", "²"]
)
def test_bad_sizes_are_refused_with_what_is_accepted(text):
    with pytest.raises(SliceValueError, match="512MiB, 4GiB, 4G or a bare number of MiB"):
        parse_size(text)


@pytest.mark.parametrize("value", [int("9" * 400), -int("9" * 400), 10**19, float(1 << 61)])
def test_sizes_beyond_any_gpu_are_refused_whatever_their_length(value):
    with pytest.raises(SliceValueError, match="larger than any GPU|more than zero"):
        parse_size(value)


@pytest.mark.parametrize("value", ["0.0001", "0.5MiB", "1023KiB", "100B", "0.999"])
def test_sizes_below_one_mib_are_refused_saying_the_smallest(value):
    with pytest.raises(SliceValueError, match="less than the smallest slice, 1MiB"):
        parse_size(value)


@pytest.mark.parametrize("value", [1.9999, 0.5, 2048.5])
def test_a_number_of_mib_with_a_fraction_is_refused_not_rounded(value):
    with pytest.raises(SliceValueError, match="with a fraction; give a whole number of MiB, or text with a unit"):
        parse_size(value)


def test_a_whole_float_is_that_many_mib_and_text_may_have_a_fraction():
    assert parse_size(2048.0) == 2048 << 20
    assert parse_size("1.9999") == int(1.9999 * (1 << 20))  # rounded down to whole bytes, as api.yaml says


@pytest.mark.parametrize("value", ["0", 0, "7", "GPU-5eed-1", " MIG-a1 "])
def test_device_selectors(value):
    assert parse_device(value) == str(value).strip()


@pytest.mark.parametrize("value", ["", " ", "banana", -1, 1.5, True, None, "GPU-", "\u0661"])
def test_bad_device_selectors_say_what_is_accepted(value):
    with pytest.raises(SliceValueError, match=r"is not a GPU index \(0, 1, ...\) or UUID \(GPU-...\)"):
        parse_device(value)


def test_format_size_reads_back():
    for size in (512 << 20, 4 << 30, 3 << 29, 80 << 30):
        assert parse_size(format_size(size)) == size


@pytest.mark.parametrize(
    "text, expected", [("30", 30), (30, 30), ("1", 1), ("100%", 100), (" 45 % ", 45), (10.0, 10), (100.0, 100)]
)
def test_sm_share_accepts_whole_percentages(text, expected):
    assert parse_sm_share(text) == expected


@pytest.mark.parametrize("text", ["0", "101", "-5", "12.5", "half", "", True, 12.5, 0.0, 101.0, "10.0"])
def test_bad_sm_shares_are_refused(text):
    with pytest.raises(SliceValueError, match="whole percentage from 1 to 100"):
        parse_sm_share(text)


def test_policies():
    assert parse_policy("Burst") == "burst"
    assert parse_policy("hard") == "hard"
    with pytest.raises(SliceValueError, match="'hard' .* or 'burst'"):
        parse_policy("soft")


@pytest.mark.parametrize("value", ["HARD", " hard", "Burst", 3, None])
def test_an_exact_policy_is_one_of_the_enum_as_written(value):
    with pytest.raises(SliceValueError, match="'hard' .* or 'burst' .*, written exactly so"):
        parse_policy(value, exact=True)
    assert parse_policy("burst", exact=True) == "burst"
