"""Pilot (27 November 2026): digits and breast_cancer with the validation epochs list doubled twice past its top."""
from tasks.linear import BreastCancer, Digits


class DigitsWide(Digits):
    name = "digits_wide"
    search_lists = {**Digits.search_lists, "epochs": [8, 15, 30, 60, 120, 240, 480]}


class BreastCancerWide(BreastCancer):
    name = "breast_cancer_wide"
    search_lists = {**BreastCancer.search_lists, "epochs": [8, 15, 30, 60, 120, 240, 480]}
