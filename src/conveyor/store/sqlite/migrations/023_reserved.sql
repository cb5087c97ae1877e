-- Reserved: the schema step of this number is made by another change.
SELECT 1;
