"""More everyday utility requests for distilling the demo target (issue 31): the held-out requests' kind
(small string, list, dict, number and file helpers), none of their names or tasks. A data set of its own
(`distil_data.py --everyday`), trained beside the first one (`train.py --distil DATA EVERYDAY`), so the first
data set's frozen prompt list stays as its seed made it."""

from __future__ import annotations

import random

from .prompts import FUNCTION_TEMPLATES, HELDOUT_NAMES, SIMPLE, new_tasks, prompt_id, request_text

# (name, args, what it does): the phrasing of prompts.SIMPLE
TASKS = [
    # strings
    ("count_digits", "s", "returns how many characters of the string s are digits"),
    ("count_spaces", "s", "returns the number of space characters in the string s"),
    ("count_lower", "s", "returns the number of lower-case letters in the string s"),
    ("swap_case", "s", "returns s with upper-case letters made lower case and lower-case letters made upper case"),
    ("remove_digits", "s", "returns the string s without its digit characters"),
    ("only_letters", "s", "returns the string made of the letters of s, in order"),
    ("last_char", "s", "returns the last character of the non-empty string s"),
    ("first_word", "sentence", "returns the first word of the sentence"),
    ("last_word", "sentence", "returns the last word of the sentence"),
    ("word_lengths", "sentence", "returns a list with the length of each word in the sentence"),
    ("longest_line", "text", "returns the longest line of the multi-line string text"),
    ("count_sentences", "text", "returns how many sentences end with a full stop in text"),
    ("acronym", "phrase", "returns the upper-case first letters of the words in phrase, joined together"),
    ("snake_to_camel", "name", "converts a snake_case name such as 'my_var_name' to camelCase"),
    ("camel_to_snake", "name", "converts a camelCase name such as 'myVarName' to snake_case"),
    ("slugify", "title", "returns title in lower case with spaces replaced by hyphens"),
    ("strip_punctuation", "s", "returns s without the punctuation characters of string.punctuation"),
    ("mask_email", "email", "returns the email with every character of the part before '@' except the first replaced by '*'"),
    ("email_domain", "email", "returns the part of the email address after the '@'"),
    ("is_valid_identifier", "name", "returns True if name is a valid Python identifier"),
    ("char_positions", "s, ch", "returns the list of indexes where the character ch occurs in s"),
    ("replace_spaces", "s", "returns s with every space replaced by an underscore"),
    ("center_text", "s, width", "returns s centred in a string of the given width, padded with spaces"),
    ("truncate", "s, n", "returns s cut to at most n characters, ending with '...' when it was cut"),
    ("repeat_chars", "s", "returns s with every character written twice"),
    ("alternate_case", "s", "returns s with letters alternately upper and lower case, starting with upper"),
    ("is_all_upper", "s", "returns True if every letter in the string s is upper case"),
    ("has_upper", "s", "returns True if the string s contains at least one upper-case letter"),
    ("count_consonants", "s", "returns the number of consonant letters in the lowercase string s"),
    ("middle_char", "s", "returns the middle character of s, or the middle two characters when its length is even"),
    ("unique_chars", "s", "returns True if no character occurs twice in the string s"),
    ("most_common_char", "s", "returns the character that occurs most often in the non-empty string s"),
    ("remove_char", "s, ch", "returns s with every occurrence of the character ch removed"),
    ("words_starting_with", "words, letter", "returns the words of the list that start with the given letter"),
    ("count_long_words", "words, n", "returns how many strings in the list words are longer than n characters"),
    ("sort_words", "sentence", "returns the words of the sentence sorted alphabetically"),
    ("sort_by_length", "words", "returns the list of strings sorted from shortest to longest"),
    ("add_prefix", "words, prefix", "returns a new list with prefix added to the start of each string"),
    ("wrap_in_quotes", "s", "returns the string s with a double quote added at each end"),
    ("to_upper_list", "words", "returns a list with each string of words in upper case"),
    ("parse_csv_line", "line", "splits a comma-separated line into a list of stripped fields"),
    ("parse_key_value", "text", "turns lines like 'name=value' into a dictionary"),
    ("count_substring", "s, sub", "returns how many times the string sub occurs in s, overlapping ones included"),
    ("ends_with_any", "s, suffixes", "returns True if the string s ends with any of the strings in suffixes"),
    ("dedent_lines", "lines", "returns the list of strings with leading whitespace removed from each"),
    ("bracket_balance", "s", "returns True if the round brackets in s are balanced"),
    ("rot13", "s", "returns s encoded with the ROT13 letter substitution"),
    ("caesar_shift", "s, k", "shifts each lowercase letter of s by k places in the alphabet, wrapping around"),
    ("number_words", "n", "returns the English word for a digit n from 0 to 9"),
    ("ordinal", "n", "returns the ordinal string of the positive integer n, such as '1st', '2nd', '3rd' or '4th'"),
    # lists
    ("sum_odd", "numbers", "returns the sum of the odd numbers in the list numbers"),
    ("count_even", "numbers", "returns how many numbers in the list are even"),
    ("count_negative", "numbers", "returns how many numbers in the list are negative"),
    ("double_all", "numbers", "returns a list with every number in numbers multiplied by two"),
    ("halve_all", "numbers", "returns a list with every number in numbers divided by two"),
    ("negate_all", "numbers", "returns a list with the negative of each number in numbers"),
    ("absolute_values", "numbers", "returns a list of the absolute values of the numbers"),
    ("first_item", "items", "returns the first item of the non-empty list items"),
    ("second_item", "items", "returns the second item of the list items, or None when it has fewer than two"),
    ("last_n", "items, n", "returns the last n items of the list items"),
    ("drop_first", "items, n", "returns the list items without its first n items"),
    ("every_other", "items", "returns every second item of the list items, starting with the first"),
    ("sum_of_squares", "numbers", "returns the sum of the squares of the numbers"),
    ("range_of", "numbers", "returns the difference between the largest and the smallest number in numbers"),
    ("median", "numbers", "returns the median of the non-empty list numbers"),
    ("mode_of", "items", "returns the item that occurs most often in the non-empty list items"),
    ("count_greater", "numbers, x", "returns how many numbers in the list are greater than x"),
    ("filter_strings", "items", "returns the items of the list that are strings"),
    ("remove_none", "items", "returns the list items without the None values"),
    ("remove_value", "items, value", "returns a new list without any item equal to value"),
    ("replace_value", "items, old, new", "returns a new list with every item equal to old replaced by new"),
    ("insert_sorted", "numbers, x", "inserts x into the sorted list numbers so that it stays sorted, and returns it"),
    ("all_equal", "items", "returns True if every item of the list items is equal to the first"),
    ("has_duplicates", "items", "returns True if some item occurs more than once in the list items"),
    ("find_duplicates", "items", "returns the list of items that occur more than once, each listed once"),
    ("intersection_count", "a, b", "returns how many distinct items the lists a and b have in common"),
    ("difference", "a, b", "returns the items of the list a that are not in the list b"),
    ("union_sorted", "a, b", "returns the sorted list of the distinct items of the lists a and b"),
    ("interleave", "a, b", "returns a list taking items alternately from a and b, then the rest of the longer one"),
    ("zip_lists", "a, b", "returns a list of (x, y) tuples pairing the items of a and b"),
    ("unzip_pairs", "pairs", "splits a list of (x, y) pairs into a list of the x values and a list of the y values"),
    ("split_in_half", "items", "returns the first half and the second half of the list items as two lists"),
    ("rotate_right", "items, k", "returns the list items rotated right by k positions"),
    ("move_zeros", "numbers", "returns the list with all zeros moved to the end, the other numbers in order"),
    ("cumulative_product", "numbers", "returns the list of running products of the numbers"),
    ("differences", "numbers", "returns the list of differences between consecutive numbers"),
    ("moving_average", "numbers, k", "returns the averages of each window of k consecutive numbers"),
    ("top_n", "numbers, n", "returns the n largest numbers, largest first"),
    ("bottom_n", "numbers, n", "returns the n smallest numbers, smallest first"),
    ("index_of_max", "numbers", "returns the index of the largest number in the non-empty list numbers"),
    ("index_of_min", "numbers", "returns the index of the smallest number in the non-empty list numbers"),
    ("count_in_range", "numbers, low, high", "returns how many numbers lie between low and high, inclusive"),
    ("group_by_length", "words", "returns a dictionary mapping each word length to the list of words of that length"),
    ("group_by_first_letter", "words", "returns a dictionary mapping each first letter to the words starting with it"),
    ("pairs_summing_to", "numbers, target", "returns the list of pairs of numbers from the list whose sum is target"),
    ("transpose", "matrix", "returns the transpose of a matrix given as a list of equal-length lists"),
    ("matrix_sum", "matrix", "returns the sum of all numbers in a matrix given as a list of lists"),
    ("diagonal", "matrix", "returns the list of the numbers on the main diagonal of a square matrix"),
    ("make_grid", "rows, cols, value", "returns a list of rows lists, each holding cols copies of value"),
    ("linear_search", "items, target", "returns True if target is in the list items, checking each item in turn"),
    ("binary_search", "numbers, target", "returns the index of target in the sorted list numbers, or -1"),
    ("bubble_sort", "numbers", "returns a sorted copy of numbers using bubble sort"),
    ("selection_sort", "numbers", "returns a sorted copy of numbers using selection sort"),
    # numbers
    ("is_odd", "n", "returns True if the integer n is odd"),
    ("is_positive", "x", "returns True if the number x is greater than zero"),
    ("is_divisible", "a, b", "returns True if the integer a is divisible by the integer b"),
    ("is_perfect_square", "n", "returns True if the non-negative integer n is a perfect square"),
    ("is_multiple_of_three", "n", "returns True if the integer n is a multiple of 3"),
    ("sign", "x", "returns 1 for a positive number, -1 for a negative one and 0 for zero"),
    ("square_root", "x", "returns the square root of the non-negative number x"),
    ("hypotenuse", "a, b", "returns the length of the hypotenuse of a right triangle with sides a and b"),
    ("triangle_area", "base, height", "returns the area of a triangle"),
    ("circle_circumference", "radius", "returns the circumference of a circle with the given radius"),
    ("sphere_volume", "radius", "returns the volume of a sphere with the given radius"),
    ("cube_volume", "side", "returns the volume of a cube with the given side length"),
    ("distance", "x1, y1, x2, y2", "returns the distance between the points (x1, y1) and (x2, y2)"),
    ("miles_to_kilometers", "miles", "converts a distance in miles to kilometers"),
    ("kelvin_to_celsius", "kelvin", "converts a temperature in kelvin to degrees Celsius"),
    ("kilograms_to_pounds", "kg", "converts a weight in kilograms to pounds"),
    ("hours_to_seconds", "hours", "returns the number of seconds in the given number of hours"),
    ("minutes_to_hours", "minutes", "converts a number of minutes to a string like '2h 5m'"),
    ("days_between_years", "start, end", "returns how many leap years there are from year start to year end, inclusive"),
    ("bmi", "weight, height", "returns the body mass index for a weight in kilograms and a height in meters"),
    ("simple_interest", "principal, rate, years", "returns the simple interest on principal at rate percent a year"),
    ("compound_interest", "principal, rate, years", "returns principal grown at rate percent a year, compounded yearly"),
    ("discount_price", "price, percent", "returns the price after a discount of percent percent"),
    ("add_tax", "price, rate", "returns the price with a tax of rate percent added"),
    ("round_to", "x, digits", "returns x rounded to the given number of decimal places"),
    ("is_close", "a, b", "returns True if the numbers a and b differ by less than 1e-9"),
    ("lcm", "a, b", "returns the least common multiple of the positive integers a and b"),
    ("divisors", "n", "returns the sorted list of the positive divisors of the positive integer n"),
    ("count_divisors", "n", "returns how many positive divisors the positive integer n has"),
    ("is_perfect_number", "n", "returns True if n equals the sum of its positive divisors other than itself"),
    ("primes_below", "n", "returns the list of prime numbers smaller than n"),
    ("collatz_steps", "n", "returns how many Collatz steps it takes for the positive integer n to reach 1"),
    ("digit_count", "n", "returns how many decimal digits the non-negative integer n has"),
    ("reverse_number", "n", "returns the non-negative integer n with its decimal digits reversed"),
    ("is_armstrong", "n", "returns True if n equals the sum of its digits each raised to the number of digits"),
    ("binary_to_int", "s", "converts a string of binary digits such as '101' to an integer"),
    ("count_bits", "n", "returns the number of 1 bits in the binary representation of the non-negative integer n"),
    ("triangular_number", "n", "returns the n-th triangular number, the sum 1 + 2 + ... + n"),
    ("sum_to_n", "n", "returns the sum of the integers from 1 to n"),
    ("powers_of_two", "n", "returns the list of the first n powers of two, starting with 1"),
    ("multiplication_table", "n", "returns a list of the strings 'n x i = result' for i from 1 to 10"),
    ("fizzbuzz", "n", "returns the list of FizzBuzz strings for the numbers 1 to n"),
    ("roman_to_int", "s", "converts a Roman numeral string such as 'XIV' to an integer"),
    ("int_to_roman", "n", "converts an integer from 1 to 3999 to a Roman numeral string"),
    ("dice_roll", "", "returns a random integer from 1 to 6"),
    ("coin_flip", "", "returns 'heads' or 'tails' at random"),
    ("random_password", "length", "returns a random string of letters and digits of the given length"),
    # dictionaries
    ("count_keys", "d", "returns the number of keys in the dictionary d"),
    ("sum_values", "d", "returns the sum of the values of the dictionary d"),
    ("min_value_key", "d", "returns the key of the dictionary d with the smallest value"),
    ("sort_by_value", "d", "returns the list of (key, value) pairs of d sorted by value"),
    ("filter_dict", "d, threshold", "returns a dictionary with the items of d whose value is above threshold"),
    ("keys_with_value", "d, value", "returns the list of keys of d that map to value"),
    ("get_or_default", "d, key, default", "returns d[key] when key is in d, else default"),
    ("increment_count", "counts, key", "adds one to counts[key], starting from zero, and returns counts"),
    ("nested_get", "d, keys", "follows the list of keys through nested dictionaries and returns the value found"),
    ("dict_to_pairs", "d", "returns the list of (key, value) tuples of the dictionary d"),
    ("rename_key", "d, old, new", "returns a copy of d with the key old renamed to new"),
    # files and paths
    ("file_extension", "path", "returns the extension of the file name in path, without the dot"),
    ("file_name", "path", "returns the last component of the path"),
    ("count_words_in_file", "path", "returns the number of words in the text file at path"),
    ("append_line", "path, line", "appends the string line and a newline to the text file at path"),
    ("read_numbers", "path", "returns the list of integers written one per line in the file at path"),
    ("file_exists", "path", "returns True if a file exists at path"),
    ("list_python_files", "folder", "returns the sorted names of the .py files in the folder"),
    ("load_json", "path", "returns the object stored as JSON in the file at path"),
    ("save_json", "data, path", "writes the object data as JSON to the file at path"),
    ("read_csv_rows", "path", "returns the rows of the CSV file at path as lists of strings"),
    # dates and times
    ("day_of_week", "year, month, day", "returns the English name of the weekday of the given date"),
    ("days_until", "year, month, day", "returns how many days there are from today until the given date"),
    ("format_date", "year, month, day", "returns the date as a string in the format 'YYYY-MM-DD'"),
    ("age_in_years", "birth_year, year", "returns the age in the given year of someone born in birth_year"),
    ("is_weekend", "year, month, day", "returns True if the given date is a Saturday or a Sunday"),
]


def tasks() -> list[tuple[str, str, str]]:
    """TASKS less any whose name holds a held-out request's name or repeats a prompts.SIMPLE name."""
    return new_tasks(TASKS, {name for name, _, _ in SIMPLE})


def prompts(seed: int, phrasings: int = 2) -> list[dict]:
    """Each task asked in `phrasings` of prompts.FUNCTION_TEMPLATES (a seeded choice, the first template
    always among them: the held-out requests' phrasing) -> prompt dicts as PromptGen makes them; as there, a
    prompt whose text holds a held-out name (a task saying "the largest number") is left out."""
    rng = random.Random(seed)
    out, kept = [], set(tasks())
    for task in TASKS:
        # NOTE: every task draws its phrasings, kept or not: leaving one out changes no other prompt
        others = rng.sample(FUNCTION_TEMPLATES[1:], max(0, phrasings - 1))
        if task not in kept:
            continue
        name, args, does = task
        for t in [FUNCTION_TEMPLATES[0], *others]:
            user = request_text(t, name, args, does)
            if any(h in user for h in HELDOUT_NAMES):
                continue
            out.append({"kind": "function", "user": user, "name": name, "source": "everyday", "id": prompt_id(user)})
    return out
