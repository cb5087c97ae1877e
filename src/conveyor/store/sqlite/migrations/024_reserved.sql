-- Reserved: this number belongs to a change made beside fair turns (026).
SELECT 1;
