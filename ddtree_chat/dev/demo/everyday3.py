"""A fourth data set of requests for distilling the demo target (issue 31): thousands of distinct function
requests of the held-out kind, built compositionally (an operation x the data it works on x a condition or a
transform, each with a name of its own), plus short standard-library helpers to explain or fix and questions
about the built-in types' methods. None of the held-out requests' names or tasks, no function name of
prompts.SIMPLE, everyday.py or everyday2.py (`distil_data.py --everyday3`, trained beside the earlier sets with
`train.py --distil DATA EVERYDAY EVERYDAY2 EVERYDAY3`)."""

from __future__ import annotations

import ast
import functools
import itertools
import math
import random
import textwrap

from . import everyday, everyday2
from .prompts import (HELDOUT_NAMES, SIMPLE, buggy, fenced, function_requests, keep_new, new_tasks, stdlib_modules,
                      without_docstring)

# A condition on one number: (word in names, clause for one number, extra arguments)
NUMBER_CONDS = [
    ("even", "is even", ""),
    ("odd", "is odd", ""),
    ("positive", "is greater than zero", ""),
    ("negative", "is below zero", ""),
    ("nonzero", "is not zero", ""),
    ("non_positive", "is zero or below", ""),
    ("above_limit", "is greater than limit", "limit"),
    ("below_limit", "is smaller than limit", "limit"),
    ("at_least_minimum", "is greater than or equal to minimum", "minimum"),
    ("at_most_cap", "is smaller than or equal to cap", "cap"),
    ("in_range", "lies from low to high, both included", "low, high"),
    ("outside_range", "lies outside the range from low to high", "low, high"),
    ("divisible_by_k", "is divisible by k", "k"),
    ("perfect_square", "is a perfect square such as 0, 1, 4 or 9", ""),
    ("power_of_two", "is a power of two such as 1, 2, 4 or 8", ""),
    ("single_digit", "has a single decimal digit, ignoring the sign", ""),
    ("two_digit", "has exactly two decimal digits, ignoring the sign", ""),
    ("multiple_of_ten", "is a multiple of 10", ""),
    ("whole", "is a whole number such as 3 or 4.0", ""),
    ("fractional", "has a fractional part, as 2.5 does", ""),
    ("near_target", "is within tolerance of target", "target, tolerance"),
    ("far_from_target", "differs from target by more than gap", "target, gap"),
    ("perfect_cube", "is a perfect cube such as 1, 8 or 27", ""),
    ("ending_in_five", "ends in the digit 5", ""),
    ("positive_even", "is even and greater than zero", ""),
    ("negative_odd", "is odd and below zero", ""),
    ("between_zero_and_one", "lies strictly between 0 and 1", ""),
]
FLOAT_CONDS = {"whole", "fractional", "between_zero_and_one"}  # meaningless for integers read from a text

# An operation on the numbers that meet a condition: (name, container argument, what it does); {w} is the
# condition's word, {s} its clause for one number, {p} for several
NUMBER_OPS = [
    ("count_{w}", "numbers", "returns how many numbers in the list numbers {p}"),
    ("filter_{w}", "numbers", "returns a new list of the numbers in numbers that {p}, in their original order"),
    ("remove_{w}", "numbers", "returns a new list of the numbers in numbers without the ones that {p}"),
    ("has_{w}", "numbers", "returns True if at least one number in the list numbers {s}"),
    ("are_all_{w}", "numbers", "returns True if every number in the list numbers {s}, and True for an empty list"),
    ("first_{w}", "numbers", "returns the first number in numbers that {s}, or None when there is none"),
    ("last_{w}", "numbers", "returns the last number in numbers that {s}, or None when there is none"),
    ("index_of_first_{w}", "numbers",
     "returns the index of the first number in numbers that {s}, or -1 when there is none"),
    ("indexes_of_{w}", "numbers", "returns the list of the indexes of the numbers in numbers that {p}"),
    ("sum_{w}", "numbers", "returns the sum of the numbers in numbers that {p}, or 0 when there are none"),
    ("max_{w}", "numbers", "returns the biggest number in numbers that {s}, or None when there is none"),
    ("min_{w}", "numbers", "returns the smallest number in numbers that {s}, or None when there is none"),
    ("mean_of_{w}", "numbers", "returns the mean of the numbers in numbers that {p}, or None when there are none"),
    ("split_{w}", "numbers",
     "returns two lists: the numbers in numbers that {p} and the other ones, both in their original order"),
    ("zero_out_{w}", "numbers", "returns a copy of the list numbers in which every number that {s} is replaced by 0"),
    ("count_{w}_values", "d", "returns how many values of the dictionary d {p}"),
    ("keep_{w}_values", "d", "returns a new dictionary with only the items of d whose value {s}"),
    ("drop_{w}_values", "d", "returns a new dictionary without the items of d whose value {s}"),
    ("keys_with_{w}_values", "d", "returns the list of the keys of the dictionary d whose value {s}"),
    ("sum_{w}_values", "d", "returns the sum of the values of the dictionary d that {p}"),
    ("count_{w}_in_matrix", "matrix", "returns how many numbers in matrix, a list of lists of numbers, {p}"),
    ("sum_{w}_in_matrix", "matrix", "returns the sum of the numbers in matrix, a list of lists of numbers, that {p}"),
    ("positions_of_{w}", "matrix",
     "returns the list of (row, column) positions of the numbers in matrix, a list of lists, that {p}"),
    ("rows_with_{w}", "matrix",
     "returns the rows of matrix, a list of lists of numbers, that hold at least one number that {s}"),
    ("count_{w}_per_row", "matrix", "returns a list with how many numbers in each row of matrix, a list of lists, {p}"),
    ("count_{w}_in_text", "text",
     "returns how many of the whitespace-separated integers in the string text, such as '4 -1 12', {p}"),
    ("sum_{w}_in_text", "text", "returns the sum of the whitespace-separated integers in the string text that {p}"),
    ("parse_{w}_numbers", "text",
     "returns the list of the whitespace-separated integers in the string text that {p}, as ints"),
    ("names_with_{w}_score", "scores",
     "returns the names of the (name, score) tuples in the list scores whose score {s}"),
    ("count_{w}_in_file", "path", "returns how many of the numbers in the text file at path, one per line, {p}"),
    ("sum_{w}_in_file", "path", "returns the sum of the numbers in the text file at path, one per line, that {p}"),
]

# A condition on one string: (name, {x} the item's noun; clause for one item; extra arguments)
STRING_CONDS = [
    ("empty_{x}", "is empty", ""),
    ("blank_{x}", "is empty or made of whitespace only", ""),
    ("{x}_longer_than", "is longer than n characters", "n"),
    ("{x}_shorter_than", "is shorter than n characters", "n"),
    ("{x}_of_length", "has exactly n characters", "n"),
    ("capitalized_{x}", "starts with an upper-case letter", ""),
    ("lowercase_{x}", "has no upper-case letter", ""),
    ("uppercase_{x}", "has at least one letter and no lower-case letter", ""),
    ("numeric_{x}", "is made of digits only", ""),
    ("alphabetic_{x}", "is made of letters only", ""),
    ("{x}_with_digits", "holds at least one digit", ""),
    ("{x}_with_spaces", "holds a space", ""),
    ("{x}_starting_with", "starts with prefix", "prefix"),
    ("{x}_ending_with", "ends with suffix", "suffix"),
    ("{x}_containing", "contains the text part", "part"),
    ("{x}_containing_any_case", "contains the text part, upper and lower case alike", "part"),
    ("{x}_with_same_ends", "has the same first and last character", ""),
    ("even_length_{x}", "has an even number of characters", ""),
    ("{x}_with_repeats", "holds some character more than once", ""),
    ("{x}_with_double_letters", "has the same letter twice in a row, as 'book' does", ""),
    ("hashtag_{x}", "starts with '#'", ""),
    ("{x}_ending_in_ing", "ends with 'ing'", ""),
    ("url_{x}", "starts with 'http://' or 'https://'", ""),
    ("email_like_{x}", "holds exactly one '@' and a '.' after it", ""),
    ("indented_{x}", "starts with a space or a tab", ""),
    ("{x}_with_punctuation", "holds a punctuation character of string.punctuation", ""),
    ("titlecase_{x}", "is in title case, as str.istitle() checks", ""),
    ("ascii_{x}", "holds only ASCII characters", ""),
    ("{x}_ending_with_punctuation", "ends with '.', '!' or '?'", ""),
    ("{x}_with_underscores", "holds an underscore", ""),
    ("quoted_{x}", "is wrapped in double quotes", ""),
]
NOT_WORDS = {"empty_{x}", "blank_{x}", "{x}_with_spaces", "indented_{x}"}  # never true of a whitespace-split word

# An operation on the strings that meet a condition: (name, container argument, what it does); {P}/{S} the
# condition's name in the plural/singular, {s}/{p} its clause
STRING_OPS = [
    ("count_{P}", "strings", "returns how many strings in the list strings {p}"),
    ("filter_{P}", "strings", "returns a new list of the strings in strings that {p}, in their original order"),
    ("remove_{P}", "strings", "returns a new list of the strings in strings without the ones that {p}"),
    ("has_{S}", "strings", "returns True if at least one string in the list strings {s}"),
    ("are_all_{P}", "strings", "returns True if every string in the list strings {s}, and True for an empty list"),
    ("first_{S}", "strings", "returns the first string in strings that {s}, or None when there is none"),
    ("last_{S}", "strings", "returns the last string in strings that {s}, or None when there is none"),
    ("index_of_first_{S}", "strings",
     "returns the index of the first string in strings that {s}, or -1 when there is none"),
    ("longest_{S}", "strings",
     "returns the longest string in strings that {s} (the first one on a tie), or None when there is none"),
    ("total_length_of_{P}", "strings", "returns the total number of characters of the strings in strings that {p}"),
    ("split_{P}", "strings", "returns two lists: the strings in strings that {p} and the other ones"),
    ("join_{P}", "strings", "returns the strings in strings that {p}, joined by single spaces"),
    ("count_{P}", "sentence", "returns how many whitespace-separated words of the string sentence {p}"),
    ("list_{P}", "sentence", "returns the list of the whitespace-separated words of sentence that {p}"),
    ("drop_{P}", "sentence", "returns sentence without its words that {p}, the other words joined by single spaces"),
    ("first_{S}", "sentence",
     "returns the first whitespace-separated word of sentence that {s}, or None when there is none"),
    ("bracket_{P}", "sentence",
     "returns sentence with every word that {s} put in square brackets, the words joined by single spaces"),
    ("count_{P}", "text", "returns how many lines of the multi-line string text {p}"),
    ("list_{P}", "text", "returns the list of the lines of the multi-line string text that {p}, without newlines"),
    ("drop_{P}", "text", "returns the multi-line string text without its lines that {p}"),
    ("number_{P}", "text", "returns the line numbers, counting from 1, of the lines of text that {p}"),
    ("count_{P}_in_file", "path", "returns how many lines of the text file at path {p}, newlines left aside"),
    ("read_{P}", "path", "returns the list of the lines of the text file at path that {p}, without newlines"),
]
ITEM = {"strings": "string", "sentence": "word", "text": "line", "path": "line"}

# A class of characters: (name in the plural, in the singular; one of them, several of them; extra arguments)
CHAR_CLASSES = [
    ("digits", "digit", "digit", "digits", ""),
    ("letters", "letter", "letter", "letters", ""),
    ("uppercase", "uppercase", "upper-case letter", "upper-case letters", ""),
    ("lowercase", "lowercase", "lower-case letter", "lower-case letters", ""),
    ("spaces", "space", "space", "spaces", ""),
    ("whitespace", "whitespace", "whitespace character (a space, tab or newline)",
     "whitespace characters (spaces, tabs and newlines)", ""),
    ("punctuation", "punctuation", "punctuation character (one of string.punctuation)",
     "punctuation characters (those of string.punctuation)", ""),
    ("consonants", "consonant", "consonant (a letter other than a, e, i, o and u, in either case)",
     "consonants (letters other than a, e, i, o and u, in either case)", ""),
    ("non_ascii", "non_ascii", "non-ASCII character", "non-ASCII characters", ""),
    ("symbols", "symbol", "character that is not a letter, a digit or a space",
     "characters that are not letters, digits or spaces", ""),
    ("hex_digits", "hex_digit", "hexadecimal digit (0-9, a-f or A-F)", "hexadecimal digits (0-9, a-f and A-F)", ""),
    ("brackets", "bracket", "bracket, one of ()[]{}", "brackets, any of ()[]{}", ""),
    ("listed_chars", "listed_char", "character of the string chars", "characters that are in the string chars",
     "chars"),
]

# An operation on one class of characters of the string s: (name, what it does, extra arguments); {w}/{v} the
# class's name in the plural/singular, {one}/{many} its description
CHAR_OPS = [
    ("count_{w}", "returns how many {many} the string s holds", ""),
    ("remove_{w}", "returns the string s without its {many}", ""),
    ("keep_{w}", "returns the string made of the {many} of s, in order", ""),
    ("has_{v}", "returns True if the string s holds at least one {one}", ""),
    ("is_all_{w}", "returns True if the string s is not empty and holds only {many}", ""),
    ("positions_of_{w}", "returns the list of the indexes of the {many} in the string s", ""),
    ("first_{v}", "returns the first {one} in the string s, or None when there is none", ""),
    ("last_{v}", "returns the last {one} in the string s, or None when there is none", ""),
    ("replace_{w}", "returns s with each of its {many} replaced by the string fill", "fill"),
    ("runs_of_{w}", "returns the list of the runs of consecutive {many} in s, each run as a string", ""),
    ("split_on_{w}", "splits s at its {many} and returns the list of the non-empty pieces", ""),
    ("distinct_{w}", "returns the sorted list of the distinct {many} in the string s", ""),
    ("share_of_{w}", "returns the fraction of the characters of s that are {many}, from 0.0 to 1.0 (0.0 for an "
                     "empty s)", ""),
    ("count_{w}_per_word", "returns a list with how many {many} each whitespace-separated word of s holds", ""),
]

# What one number becomes: (verb in names, its new value, extra arguments)
NUMBER_MAPS = [
    ("square", "its square", ""),
    ("cube", "its cube", ""),
    ("double", "twice its value", ""),
    ("triple", "three times its value", ""),
    ("halve", "half its value", ""),
    ("negate", "its negative", ""),
    ("abs", "its absolute value", ""),
    ("increment", "its value plus step", "step"),
    ("scale", "its value times factor", "factor"),
    ("round", "its value rounded to the nearest integer", ""),
    ("round_places", "its value rounded to places decimal places", "places"),
    ("clamp", "its value limited to the range from low to high", "low, high"),
    ("reciprocal", "1 divided by it, or None when it is 0", ""),
    ("sign", "-1, 0 or 1 according to its sign", ""),
    ("mod", "its remainder when divided by k", "k"),
    ("last_digit", "its last decimal digit, ignoring the sign", ""),
    ("truncate", "its integer part, cutting toward zero", ""),
    ("percent", "a percentage string, such as '25.0%' for 0.25", ""),
    ("format_cents", "a string with two decimal places, such as '3.50'", ""),
    ("floor_zero", "0 when it is negative and itself otherwise", ""),
]
NUMBER_MAP_OPS = [  # (name, container argument, what it does): {v} the verb, {what} the new value
    ("{v}_each", "numbers", "returns a new list in which each number of the list numbers is replaced by {what}"),
    ("{v}_values", "d", "returns a new dictionary with the keys of d, each value replaced by {what}"),
    ("{v}_each_in_matrix", "matrix",
     "returns a new list of lists in which each number of matrix, a list of lists, is replaced by {what}"),
    ("{v}_each_in_text", "text", "takes a string of whitespace-separated integers such as '4 -1 12' and returns the "
                                 "string of those numbers, each replaced by {what}, separated by single spaces"),
    ("{v}_in_place", "numbers",
     "replaces each number of the list numbers by {what}, changing the list in place and returning None"),
]

# What one string becomes: (verb in names, its new value, extra arguments)
STRING_MAPS = [
    ("upper", "its upper-case form", ""),
    ("lower", "its lower-case form", ""),
    ("strip", "itself without leading and trailing whitespace", ""),
    ("reverse", "its characters in reverse order", ""),
    ("shorten", "its first n characters", "n"),
    ("pad", "itself padded on the right with spaces to width characters", "width"),
    ("prefix", "itself with the string prefix added in front", "prefix"),
    ("suffix", "itself with the string suffix added at the end", "suffix"),
    ("bracket", "itself in square brackets", ""),
    ("underscore", "itself with its spaces replaced by underscores", ""),
    ("double_chars", "itself with every character written twice", ""),
    ("swap_case", "itself with the case of every letter swapped", ""),
    ("mask", "itself with every character but the last 4 replaced by '*'", ""),
    ("devowel", "itself without the letters a, e, i, o and u in either case", ""),
    ("quote", "itself in double quotes", ""),
    ("repeat", "itself written twice", ""),
    ("dedupe_chars", "itself with each character kept at its first occurrence only", ""),
    ("rotate_chars", "itself with its first character moved to the end", ""),
]
STRING_MAP_OPS = [  # (name, container argument, what it does): {v} the verb, {what} the new value
    ("{v}_strings", "strings", "returns a new list in which each string of the list strings is replaced by {what}"),
    ("{v}_each_word", "sentence", "returns sentence with each whitespace-separated word replaced by {what}, the "
                                  "words joined by single spaces"),
    ("{v}_each_line", "text", "returns the multi-line string text with each line replaced by {what}"),
    ("{v}_string_values", "d", "returns a new dictionary with the keys of d, each string value replaced by {what}"),
]

# Two numbers at the same place of two collections: (verb in names, what is made of them)
PAIR_MAPS = [
    ("add", "the sum of the two"),
    ("subtract", "the first minus the second"),
    ("multiply", "the product of the two"),
    ("divide", "the first divided by the second, or None when the second is 0"),
    ("max", "the bigger of the two"),
    ("min", "the smaller of the two"),
    ("mean", "the mean of the two"),
    ("gap", "the absolute difference of the two"),
    ("equal", "True when the two are equal and False otherwise"),
    ("compare", "-1, 0 or 1 as the first is smaller than, equal to or bigger than the second"),
]
PAIR_OPS = [  # (name, what it does): {v} the verb, {what} what is made of the two numbers
    ("{v}_lists", "returns a list holding, for each position of the equal-length lists of numbers a and b, {what}"),
    ("{v}_matrices", "returns a new list of lists holding, for each position of the same-shaped matrices a and b "
                     "(lists of lists of numbers), {what}"),
    ("{v}_shared_keys", "returns a dictionary mapping each key found in both dictionaries a and b to a value made of "
                        "its two values: {what}"),
]

# Records (dictionaries in a list): (plural, singular, the label key, the number key)
RECORDS = [
    ("students", "student", "name", "grade"),
    ("products", "product", "name", "price"),
    ("employees", "employee", "name", "salary"),
    ("books", "book", "title", "pages"),
    ("cities", "city", "name", "population"),
    ("movies", "movie", "title", "rating"),
    ("runners", "runner", "name", "seconds"),
    ("files", "file", "name", "size"),
    ("players", "player", "name", "score"),
    ("countries", "country", "name", "area"),
    ("orders", "order", "code", "total"),
    ("songs", "song", "title", "plays"),
    ("recipes", "recipe", "name", "minutes"),
    ("cars", "car", "model", "mileage"),
    ("mountains", "mountain", "name", "height"),
    ("rivers", "river", "name", "length"),
    ("tasks", "task", "title", "priority"),
    ("apps", "app", "name", "downloads"),
    ("hotels", "hotel", "name", "stars"),
    ("planets", "planet", "name", "moons"),
    ("patients", "patient", "name", "age"),
    ("stocks", "stock", "symbol", "price"),
    ("flights", "flight", "number", "delay"),
    ("trees", "tree", "species", "height"),
    ("courses", "course", "title", "credits"),
    ("games", "game", "title", "rating"),
    ("teams", "team", "name", "wins"),
    ("customers", "customer", "name", "balance"),
    ("houses", "house", "address", "price"),
    ("laptops", "laptop", "model", "weight"),
    ("podcasts", "podcast", "title", "episodes"),
    ("lakes", "lake", "name", "depth"),
    ("buildings", "building", "name", "floors"),
    ("restaurants", "restaurant", "name", "rating"),
    ("emails", "email", "subject", "size"),
    ("sensors", "sensor", "label", "reading"),
    ("invoices", "invoice", "number", "amount"),
    ("athletes", "athlete", "name", "medals"),
    ("videos", "video", "title", "views"),
    ("ingredients", "ingredient", "name", "calories"),
]
# (name, extra arguments, what it does): {P}/{S} the records' plural/singular, {l} the label key, {k} the number
# key, {of} what the records are
RECORD_OPS = [
    ("{S}_with_highest_{k}", "", "returns the '{l}' of the {S} with the highest '{k}' in {P}, {of}"),
    ("{S}_with_lowest_{k}", "", "returns the '{l}' of the {S} with the lowest '{k}' in {P}, {of}"),
    ("total_{k}_of_{P}", "", "returns the sum of the '{k}' values in {P}, {of}"),
    ("mean_{k}_of_{P}", "", "returns the mean of the '{k}' values in {P}, {of}, or None when it is empty"),
    ("sort_{P}_by_{k}", "", "returns {P}, {of}, sorted by '{k}' from the lowest to the highest"),
    ("rank_{P}_by_{k}", "", "returns the '{l}' values of {P}, {of}, ordered from the highest '{k}' to the lowest"),
    ("{P}_with_{k}_above", "threshold",
     "returns the '{l}' values of the {P} whose '{k}' is greater than threshold, {P} being {of}"),
    ("count_{P}_with_{k}_above", "threshold",
     "returns how many of the {P} have a '{k}' greater than threshold, {P} being {of}"),
    ("{k}_of_{S}", "{l}", "returns the '{k}' of the {S} whose '{l}' is {l} in {P}, {of}, or None when there is none"),
    ("map_{S}_{k}", "", "returns a dictionary mapping the '{l}' of each {S} in {P}, {of}, to its '{k}'"),
    ("top_{P}_by_{k}", "n",
     "returns the '{l}' values of the n {P} with the highest '{k}', highest first, {P} being {of}"),
    ("{k}_range_of_{P}", "",
     "returns the difference between the highest and the lowest '{k}' in {P}, a non-empty list of dictionaries with "
     "the keys '{l}' and '{k}'"),
    ("{P}_missing_{k}", "",
     "returns the '{l}' values of the dictionaries in {P}, each with a '{l}' key, that have no '{k}' key"),
]

# Units of one quantity: (name, in the plural, in the singular, its size in a base unit)
UNITS = {
    "length": [("millimeters", "millimeters", "millimeter", 0.001), ("centimeters", "centimeters", "centimeter", 0.01),
               ("meters", "meters", "meter", 1), ("kilometers", "kilometers", "kilometer", 1000),
               ("inches", "inches", "inch", 0.0254), ("feet", "feet", "foot", 0.3048),
               ("yards", "yards", "yard", 0.9144), ("miles", "miles", "mile", 1609.344),
               ("nautical_miles", "nautical miles", "nautical mile", 1852)],
    "weight": [("grams", "grams", "gram", 1), ("kilograms", "kilograms", "kilogram", 1000),
               ("milligrams", "milligrams", "milligram", 0.001), ("pounds", "pounds", "pound", 453.59237),
               ("ounces", "ounces", "ounce", 28.349523125), ("stones", "stones", "stone", 6350.29318),
               ("tonnes", "tonnes", "tonne", 1e6)],
    "volume": [("milliliters", "milliliters", "milliliter", 1), ("liters", "liters", "liter", 1000),
               ("gallons", "US gallons", "US gallon", 3785.411784), ("pints", "US pints", "US pint", 473.176473),
               ("cups", "US cups", "US cup", 236.5882365), ("teaspoons", "teaspoons", "teaspoon", 4.92892159375),
               ("tablespoons", "tablespoons", "tablespoon", 14.78676478125),
               ("cubic_meters", "cubic meters", "cubic meter", 1e6)],
    "duration": [("milliseconds", "milliseconds", "millisecond", 0.001), ("seconds", "seconds", "second", 1),
                 ("minutes", "minutes", "minute", 60), ("hours", "hours", "hour", 3600),
                 ("days", "days", "day", 86400), ("weeks", "weeks", "week", 604800)],
    "data size": [("bits", "bits", "bit", 0.125), ("bytes", "bytes", "byte", 1),
                  ("kilobytes", "kilobytes", "kilobyte", 1024), ("megabytes", "megabytes", "megabyte", 1024 ** 2),
                  ("gigabytes", "gigabytes", "gigabyte", 1024 ** 3),
                  ("terabytes", "terabytes", "terabyte", 1024 ** 4)],
    "area": [("square_meters", "square meters", "square meter", 1),
             ("square_kilometers", "square kilometers", "square kilometer", 1e6),
             ("hectares", "hectares", "hectare", 1e4), ("acres", "acres", "acre", 4046.8564224),
             ("square_feet", "square feet", "square foot", 0.09290304),
             ("square_miles", "square miles", "square mile", 2589988.110336)],
    "speed": [("meters_per_second", "meters per second", "meter per second", 1),
              ("kilometers_per_hour", "kilometers per hour", "kilometer per hour", 1 / 3.6),
              ("miles_per_hour", "miles per hour", "mile per hour", 0.44704), ("knots", "knots", "knot", 1852 / 3600),
              ("feet_per_second", "feet per second", "foot per second", 0.3048)],
    "energy": [("joules", "joules", "joule", 1), ("kilojoules", "kilojoules", "kilojoule", 1000),
               ("calories", "calories", "calorie", 4.184), ("kilocalories", "kilocalories", "kilocalorie", 4184),
               ("watt_hours", "watt hours", "watt hour", 3600),
               ("kilowatt_hours", "kilowatt hours", "kilowatt hour", 3.6e6)],
    "pressure": [("pascals", "pascals", "pascal", 1), ("kilopascals", "kilopascals", "kilopascal", 1000),
                 ("bars", "bars", "bar", 1e5), ("atmospheres", "atmospheres", "atmosphere", 101325),
                 ("psi", "psi", "psi", 6894.757)],
    "angle": [("degrees", "degrees", "degree", 1), ("radians", "radians", "radian", 180 / math.pi),
              ("turns", "turns", "turn", 360), ("gradians", "gradians", "gradian", 0.9)],
}

# Shapes and other geometry (name, args, what it does)
GEOMETRY = [
    ("square_area", "side", "returns the area of a square with the given side length"),
    ("square_perimeter", "side", "returns the perimeter of a square with the given side length"),
    ("square_diagonal", "side", "returns the length of the diagonal of a square with the given side length"),
    ("rectangle_diagonal", "width, height", "returns the length of the diagonal of a rectangle"),
    ("circle_area_from_diameter", "diameter", "returns the area of a circle with the given diameter"),
    ("radius_from_circumference", "circumference", "returns the radius of a circle with the given circumference"),
    ("triangle_perimeter", "a, b, c", "returns the perimeter of a triangle with sides a, b and c"),
    ("heron_area", "a, b, c", "returns the area of a triangle with sides a, b and c, using Heron's formula"),
    ("is_valid_triangle", "a, b, c", "returns True if three lengths a, b and c can be the sides of a triangle"),
    ("is_right_triangle", "a, b, c", "returns True if the sides a, b and c, in any order, form a right triangle"),
    ("equilateral_triangle_area", "side", "returns the area of an equilateral triangle with the given side length"),
    ("third_angle", "a, b", "returns the third angle in degrees of a triangle whose other angles are a and b degrees"),
    ("parallelogram_area", "base, height", "returns the area of a parallelogram"),
    ("rhombus_area", "d1, d2", "returns the area of a rhombus with diagonals of lengths d1 and d2"),
    ("hexagon_area", "side", "returns the area of a regular hexagon with the given side length"),
    ("polygon_perimeter", "sides, length",
     "returns the perimeter of a regular polygon with the given number of sides, each of the given length"),
    ("interior_angle", "sides",
     "returns the size in degrees of each interior angle of a regular polygon with the given number of sides"),
    ("ellipse_area", "a, b", "returns the area of an ellipse with semi-axes a and b"),
    ("sector_area", "radius, angle", "returns the area of a circle sector with the given radius and angle in degrees"),
    ("arc_length", "radius, angle", "returns the length of a circle arc with the given radius and angle in degrees"),
    ("ring_area", "outer, inner",
     "returns the area between two circles with the same centre and radii outer and inner"),
    ("cuboid_volume", "length, width, height", "returns the volume of a rectangular box"),
    ("cuboid_surface_area", "length, width, height", "returns the total surface area of a rectangular box"),
    ("cube_surface_area", "side", "returns the total surface area of a cube with the given side length"),
    ("sphere_surface_area", "radius", "returns the surface area of a sphere with the given radius"),
    ("cylinder_surface_area", "radius, height", "returns the total surface area of a closed cylinder"),
    ("cone_volume", "radius, height", "returns the volume of a cone"),
    ("cone_slant_height", "radius, height", "returns the slant height of a cone"),
    ("pyramid_volume", "base_side, height", "returns the volume of a pyramid with a square base"),
    ("hemisphere_volume", "radius", "returns the volume of a half sphere with the given radius"),
    ("point_in_circle", "x, y, cx, cy, r",
     "returns True if the point (x, y) lies inside or on the circle with centre (cx, cy) and radius r"),
    ("point_in_box", "x, y, left, bottom, right, top",
     "returns True if the point (x, y) lies inside or on the edge of the rectangle from (left, bottom) to "
     "(right, top)"),
    ("rectangles_overlap", "a, b", "returns True if two rectangles given as (x1, y1, x2, y2) tuples overlap"),
    ("polygon_area", "points",
     "returns the area of a polygon given as a list of (x, y) corners in order, using the shoelace formula"),
    ("triangle_centroid", "p, q, r",
     "returns the centroid of the triangle with corners p, q and r, each an (x, y) tuple"),
]

# Integers in a range that meet a condition (NUMBER_CONDS' words) and what is asked of them
RANGE_CONDS = ["even", "odd", "divisible_by_k", "perfect_square", "power_of_two", "single_digit", "two_digit",
               "multiple_of_ten"]
RANGE_OPS = [
    ("{w}_between", "returns the list of the integers from start to stop, both included, that {p}"),
    ("count_{w}_between", "returns how many integers from start to stop, both included, {p}"),
    ("sum_{w}_between", "returns the sum of the integers from start to stop, both included, that {p}"),
]

# Digits of a non-negative integer n: (name, description)
DIGIT_CLASSES = [("even", "even digits"), ("odd", "odd digits"), ("zero", "zero digits"),
                 ("nonzero", "digits other than 0"), ("big", "digits from 5 to 9"), ("small", "digits from 0 to 4")]
DIGIT_OPS = [
    ("count_{w}_digits", "returns how many {d} the non-negative integer n has"),
    ("sum_{w}_digits", "returns the sum of the {d} of the non-negative integer n (0 when it has none)"),
    ("product_{w}_digits", "returns the product of the {d} of the non-negative integer n (1 when it has none)"),
    ("remove_{w}_digits", "returns the non-negative integer n without its {d}, as an int (0 when no digit is left)"),
    ("list_{w}_digits", "returns the list of the {d} of the non-negative integer n, from left to right"),
]

SECOND_PHRASING = 0.4  # the share of tasks asked a second time, in another phrasing than the held-out requests'
N_EXPLAIN, N_FIX = 900, 250  # standard-library helpers explained, and fixed after a seeded one-operator bug
EXPLAIN_ASKS = [
    "What does this function from the Python standard library do?",
    "Explain this Python function in a few sentences:",
    "What is this Python helper for, and how does it work?",
    "Describe what this function returns and when:",
    "Explain this Python code to a beginner:",
]
FIX_ASKS = [
    "One operator in this Python function is wrong. Find the bug and show the corrected function:",
    "This function has a bug: one comparison or arithmetic operator was changed. Fix it:",
]
METHOD_ASKS = [
    "What does the Python method {t}.{m}() do? Show a short example.",
    "When would I use {t}.{m}() in Python? Give one example.",
]
METHOD_TYPES = (str, bytes, list, tuple, dict, set, frozenset, int, float)


def _plural(clause: str) -> str:
    """'is even' -> 'are even', 'is a multiple of k' -> 'are multiples of k', 'has a ...' -> 'have a ...',
    'starts with' -> 'start with'."""
    verb, rest = clause.split(" ", 1)
    if verb == "is" and rest.startswith("a "):
        rest = rest[2:]
        end = min([i for i in (rest.find(" of "), rest.find(" such as")) if i > 0] or [len(rest)])
        rest = rest[:end] + "s" + rest[end:]
    return {"is": "are", "has": "have"}.get(verb, verb[:-1]) + " " + rest


def _args(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def _number_tasks() -> list[tuple[str, str, str]]:
    out = []
    for w, s, extra in NUMBER_CONDS:
        for name, arg, does in NUMBER_OPS:
            if not (w in FLOAT_CONDS and arg == "text"):
                out.append((name.format(w=w), _args(arg, extra), does.format(s=s, p=_plural(s))))
    for w in RANGE_CONDS:
        s, extra = next((s, e) for cw, s, e in NUMBER_CONDS if cw == w)
        for name, does in RANGE_OPS:
            out.append((name.format(w=w), _args("start, stop", extra), does.format(p=_plural(s))))
    return out


def _string_tasks() -> list[tuple[str, str, str]]:
    out = []
    for noun, s, extra in STRING_CONDS:
        for name, arg, does in STRING_OPS:
            if arg == "sentence" and noun in NOT_WORDS:
                continue
            x = ITEM[arg]
            out.append((name.format(P=noun.format(x=x + "s"), S=noun.format(x=x)), _args(arg, extra),
                        does.format(s=s, p=_plural(s))))
    for w, v, one, many, extra in CHAR_CLASSES:
        for name, does, fill in CHAR_OPS:
            out.append((name.format(w=w, v=v), _args("s", fill, extra), does.format(one=one, many=many)))
    return out


def _map_tasks() -> list[tuple[str, str, str]]:
    out = []
    for maps, ops in ((NUMBER_MAPS, NUMBER_MAP_OPS), (STRING_MAPS, STRING_MAP_OPS)):
        for v, what, extra in maps:
            for name, arg, does in ops:
                out.append((name.format(v=v), _args(arg, extra), does.format(what=what)))
    for v, what in PAIR_MAPS:
        for name, does in PAIR_OPS:
            out.append((name.format(v=v), "a, b", does.format(what=what)))
    return out


def _record_tasks() -> list[tuple[str, str, str]]:
    out = []
    for P, S, label, key in RECORDS:
        of = f"a list of dictionaries with the keys '{label}' and '{key}'"
        for name, extra, does in RECORD_OPS:
            out.append((name.format(P=P, S=S, k=key), _args(P, extra.format(l=label)),
                        does.format(P=P, S=S, l=label, k=key, of=of)))
    return out


def _ratio(n: float) -> str:
    """1024 -> '1,024', 10763910.4 -> '10,763,910' (no exponent), 2.54 -> '2.54', 1/0.3048 -> '3.28084'."""
    return f"{round(n):,}" if abs(n - round(n)) < 1e-9 or n >= 1e5 else f"{n:.6g}"


def _unit_tasks() -> list[tuple[str, str, str]]:
    out = []
    for quantity, units in UNITS.items():
        for a, a_text, a_one, a_size in units:
            for b, b_text, b_one, b_size in units:
                if a == b:
                    continue
                # the rate is given from the bigger unit, so that it is not a small fraction
                if a_size > b_size:
                    rate = f"1 {a_one} being {_ratio(a_size / b_size)} {b_text}"
                else:
                    rate = f"1 {b_one} being {_ratio(b_size / a_size)} {a_text}"
                an = "an" if quantity[0] in "aeiou" else "a"
                out.append((f"{a}_to_{b}", a, f"converts {an} {quantity} in {a_text} to {b_text}, {rate}"))
                out.append((f"{a}_list_to_{b}", "values", f"converts a list of {quantity} values in {a_text} to a new "
                            f"list in {b_text}, each rounded to 2 decimal places, {rate}"))
    return out


def _digit_tasks() -> list[tuple[str, str, str]]:
    return [(name.format(w=w), "n", does.format(d=d)) for w, d in DIGIT_CLASSES for name, does in DIGIT_OPS]


def tasks() -> list[tuple[str, str, str]]:
    """Every composed (name, args, what it does), less any whose name holds a held-out request's name or repeats a
    function name of prompts.SIMPLE, everyday.py or everyday2.py, or whose task repeats one of theirs."""
    earlier = SIMPLE + everyday.TASKS + everyday2.TASKS
    composed = (_number_tasks() + _string_tasks() + _map_tasks() + _record_tasks() + _unit_tasks() + GEOMETRY
                + _digit_tasks())
    taken = {n for n, _, _ in earlier} | {n for n, _, _ in everyday2.BUGS}
    done = {d for _, _, d in earlier}
    return [t for t in new_tasks(composed, taken) if t[2] not in done]


@functools.lru_cache(maxsize=1)
def helpers() -> tuple[str, ...]:
    """Short functions and methods (4-25 lines) of this interpreter's standard library that the first set never
    quotes (private, or without a docstring: prompts._funcs_of takes neither), docstring removed, none holding a
    held-out name; in file order, each once."""
    out = []
    for module, source in stdlib_modules():
        if module.split(".")[0] == "encodings":  # its ~100 codec modules repeat one boilerplate
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in [*tree.body, *(m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body)]:
            if not isinstance(node, ast.FunctionDef):
                continue
            doc = ast.get_docstring(node)
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if (not node.name.startswith("_") and doc and len(doc) >= 15) or not 4 <= node.end_lineno - start + 1 <= 25:
                continue
            try:
                code = without_docstring(textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno])))
            except (SyntaxError, ValueError):
                continue
            if len(code) < 1200 and code.count("\n") < 25 and not any(h in code for h in HELDOUT_NAMES):
                out.append(code)
    return tuple(dict.fromkeys(out))


def methods() -> list[tuple[str, str]]:
    """(type name, method name) of the built-in types' public methods."""
    return [(t.__name__, m) for t in METHOD_TYPES for m in sorted(vars(t)) if not m.startswith("_")
            and callable(getattr(t, m))]


def prompts(seed: int) -> list[dict]:
    """Each task in the held-out requests' phrasing, a seeded SECOND_PHRASING share of them in another too
    (prompts.FUNCTION_TEMPLATES or EXTRA_TEMPLATES); N_EXPLAIN seeded helpers to explain and N_FIX others with one
    flipped operator; each built-in method asked in both METHOD_ASKS -> prompt dicts as PromptGen makes them; a
    prompt holding a held-out name, or repeating one, is left out."""
    rng = random.Random(seed)
    out = function_requests(tasks(), rng, SECOND_PHRASING)
    code = list(helpers())
    rng.shuffle(code)
    for c in code[:N_EXPLAIN]:
        out.append({"kind": "explain", "user": f"{rng.choice(EXPLAIN_ASKS)}\n\n{fenced(c)}"})
    fixes = itertools.islice((bad for bad in (buggy(c, rng) for c in code[N_EXPLAIN:]) if bad is not None), N_FIX)
    out += [{"kind": "fix", "user": f"{rng.choice(FIX_ASKS)}\n\n{fenced(bad)}"} for bad in fixes]
    out += [{"kind": "general", "user": ask.format(t=t, m=m)} for t, m in methods() for ask in METHOD_ASKS]
    return keep_new(out, "everyday3")
